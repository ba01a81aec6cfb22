//! A scripted model provider on a loopback port (or a test host's), speaking the wire formats pi
//! uses:
//!
//! - chat: OpenAI chat completions (`…/chat/completions`) and Anthropic messages (`…/messages`),
//!   each answering with the next step of its script (a tool call, or text), streamed (server-sent
//!   events, usage in the last chunk or in `message_start` and `message_delta`) when the request
//!   asks for a stream and as one JSON body when not;
//! - classifiers: OpenAI's decisions (`…/decisions`) and TypeSafe's System One (`…/systemone`),
//!   answering every question;
//! - images: OpenRouter's image models (`…/chat/completions` with `modalities` holding `image`),
//!   answering with one small PNG.
//!
//! Classifier and image calls do not take a step of the script. Every request is kept for the test
//! to read, with its path and headers. pi reaches it through a provider in `models.json` (see
//! [`FakeModel::models_json`]). Only what cannot run here (a real model) is faked; pi, its HTTP
//! client and the wire formats are real.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

/// One answer of the script.
#[derive(Debug, Clone)]
pub enum Step {
    /// Call this tool with these arguments.
    Call(String, Value),
    /// Answer with text (ends the agent's run).
    Text(String),
    /// Answer with this HTTP status and an error body (a provider failing, or refusing the key).
    Status(u16),
    /// Down for the run that reaches it: every request that carries a tool's result (the same
    /// conversation, retried) is answered with this status and does not move the script; the
    /// first request without one (a new run of the job) is answered by the next step.
    DownForThisRun(u16),
}

impl Step {
    pub fn call(name: &str, args: Value) -> Step {
        Step::Call(name.to_owned(), args)
    }

    pub fn text(text: &str) -> Step {
        Step::Text(text.to_owned())
    }

    pub fn status(code: u16) -> Step {
        Step::Status(code)
    }

    /// A script written as JSON (the demo's `examples/demo/script.json`): a list of
    /// `{"call": TOOL, "args": {...}}` and `{"text": TEXT}` steps.
    pub fn script_from_json(text: &str) -> Result<Vec<Step>, String> {
        let steps: Vec<Value> = serde_json::from_str(text)
            .map_err(|e| format!("the script is not a JSON list ({e})"))?;
        steps
            .iter()
            .enumerate()
            .map(|(i, s)| match (s.get("call"), s.get("text")) {
                (Some(Value::String(name)), _) => Ok(Step::call(name, s["args"].clone())),
                (None, Some(Value::String(t))) => Ok(Step::text(t)),
                _ => Err(format!(
                    "step {i} is neither {{\"call\": TOOL, \"args\": ...}} nor {{\"text\": TEXT}}"
                )),
            })
            .collect()
    }

    /// One tool call by each route pi has to an MCP tool, against server-everything offered as
    /// `direct` (exposure `direct`), `web` (`deferred`: loaded by `tool_search` first) and
    /// `scripted` (called from a `codemode` script).
    pub fn every_route() -> Vec<Step> {
        vec![
            Step::call("mcp__direct__echo", json!({"message": "by a direct tool"})),
            Step::call("tool_search", json!({"query": "get_sum"})),
            Step::call("mcp__web__get_sum", json!({"a": 2, "b": 3})),
            Step::call(
                "codemode",
                json!({"code": "const r = await tools.mcp__scripted__echo({message: 'from a script'}); return r.content[0].text;"}),
            ),
        ]
    }
}

/// What the model was sent.
#[derive(Debug, Clone)]
pub struct Request {
    /// The request's path (`/v1/chat/completions`, ...).
    pub path: String,
    /// The request's `Authorization` header, if any.
    pub authorization: Option<String>,
    /// Every header, names in lowercase.
    pub headers: Vec<(String, String)>,
    pub body: Value,
    /// When its first line was read (benchmarks time a job to its first model request).
    pub at: std::time::Instant,
}

/// What a request was, by its path and body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    OpenAiChat,
    AnthropicChat,
    Decisions,
    SystemOne,
    Images,
    Other,
}

impl Request {
    /// A header's value (the name in any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn kind(&self) -> Kind {
        let images = self.body["modalities"]
            .as_array()
            .is_some_and(|m| m.iter().any(|v| v == "image"));
        let path = self.path.split('?').next().unwrap_or_default();
        if path.ends_with("/chat/completions") {
            if images {
                Kind::Images
            } else {
                Kind::OpenAiChat
            }
        } else if path.ends_with("/messages") {
            Kind::AnthropicChat
        } else if path.ends_with("/decisions") {
            Kind::Decisions
        } else if path.ends_with("/systemone") {
            Kind::SystemOne
        } else {
            Kind::Other
        }
    }

    /// Whether the request asked for a streamed answer.
    pub fn stream(&self) -> bool {
        self.body["stream"] == true
    }

    /// The names of the tools declared to the model (OpenAI's or Anthropic's shape).
    pub fn tools(&self) -> Vec<String> {
        self.body["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| {
                        t["function"]["name"]
                            .as_str()
                            .or_else(|| t["name"].as_str())
                            .map(str::to_owned)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The text of the last message (a tool result, on every request after the first).
    pub fn last_text(&self) -> String {
        let last = &self.body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned();
        match last.as_ref().map(|m| &m["content"]) {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        }
    }
}

/// The provider; stops listening when dropped.
pub struct FakeModel {
    pub port: u16,
    /// The address clients reach it at (127.0.0.1, or a test host's).
    address: IpAddr,
    requests: Arc<Mutex<Vec<Request>>>,
    listener: Option<TcpListener>,
    /// Set when it is dropped: a server answering on threads (see [`FakeModel::serve_by`]) stops
    /// accepting once it sees it.
    stopping: Arc<std::sync::atomic::AtomicBool>,
}

/// What a provider serving by [`FakeModel::serve_by`] does with one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Answers with this step.
    Step(Step),
    /// Says nothing, and holds the connection until the client closes it (or ten minutes pass).
    Hang,
    /// Resets the connection (TCP RST) without a word.
    Reset,
}

/// The provider name pi knows the fake by, and its model id.
pub const PROVIDER: &str = "fake";
pub const MODEL: &str = "fake-model";

/// What each chat answer reports it used: input and output tokens.
pub const CHAT_USAGE: (u64, u64) = (100, 20);
/// What each classifier answer reports it used.
pub const CLASSIFIER_USAGE: (u64, u64) = (50, 0);
/// What each image answer reports it used.
pub const IMAGE_USAGE: (u64, u64) = (10, 1290);

/// A 1x1 PNG, the image every image call gets.
pub const PNG_BASE64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

impl FakeModel {
    pub fn start(script: Vec<Step>) -> FakeModel {
        FakeModel::start_on(0, script)
    }

    /// Listens on `port` of 127.0.0.1 (0: any free port).
    pub fn start_on(port: u16, script: Vec<Step>) -> FakeModel {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("the port is free");
        FakeModel::serve(listener, Ipv4Addr::LOCALHOST.into(), script)
    }

    /// On a free port of a test host, reached at its IPv4 address: where a job with egress off
    /// reaches it (its own network reaches no address of this host).
    pub fn start_in(host: &crate::netns::TestHost, script: Vec<Step>) -> FakeModel {
        FakeModel::serve(host.tcp(0), host.v4.into(), script)
    }

    /// The address clients reach it at.
    pub fn address(&self) -> IpAddr {
        self.address
    }

    /// Serves on `listener`, which clients reach at `address` (a listener bound in a test host,
    /// say: [`crate::netns::TestHost::tcp`], reached at the host's address).
    pub fn serve(listener: TcpListener, address: IpAddr, script: Vec<Step>) -> FakeModel {
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let accept = listener.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut next = 0usize;
            for stream in accept.incoming() {
                let Ok(stream) = stream else { break };
                // One request at a time, in order: the script is a sequence.
                let Some(request) = read_request(&stream) else {
                    continue;
                };
                if request.body.is_null() {
                    // The listener was woken to stop.
                    break;
                }
                let kind = request.kind();
                let streamed = request.stream();
                let body = request.body.clone();
                seen.lock().unwrap().push(request);
                let _ = match kind {
                    Kind::Decisions => json_answer(stream, &decisions(&body)),
                    Kind::SystemOne => json_answer(stream, &system_one(&body)),
                    Kind::Images => json_answer(stream, &images(&body)),
                    _ => {
                        // A tool's result: OpenAI's `tool` message, or Anthropic's `tool_result`.
                        let continues = body["messages"].as_array().is_some_and(|m| {
                            m.iter().any(|m| {
                                m["role"] == "tool"
                                    || m["content"].as_array().is_some_and(|c| {
                                        c.iter().any(|p| p["type"] == "tool_result")
                                    })
                            })
                        });
                        if let Some(Step::DownForThisRun(code)) = script.get(next) {
                            if continues {
                                let _ = status_answer(stream, *code);
                                continue;
                            }
                            next += 1;
                        }
                        let step = script
                            .get(next)
                            .cloned()
                            .unwrap_or_else(|| Step::text("done"));
                        next += 1;
                        chat_answer(stream, kind, streamed, &body, next, &step)
                    }
                };
            }
        });
        FakeModel {
            port,
            address,
            requests,
            listener: Some(listener),
            stopping: Arc::default(),
        }
    }

    /// Serves on `listener` (reached at `address`), each request on a thread of its own and
    /// answered as `reply` says from the request alone: many jobs at once, each its own
    /// conversation, where [`FakeModel::serve`]'s one script would be shared by all. Classifier
    /// and image calls are answered as [`FakeModel::serve`] answers them.
    pub fn serve_by(
        listener: TcpListener,
        address: IpAddr,
        reply: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> FakeModel {
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (seen, stop, accept) = (
            requests.clone(),
            stopping.clone(),
            listener.try_clone().unwrap(),
        );
        let reply = Arc::new(reply);
        std::thread::spawn(move || {
            for (n, stream) in accept.incoming().enumerate() {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { break };
                let (seen, reply) = (seen.clone(), reply.clone());
                std::thread::spawn(move || {
                    if let Some(request) = read_request(&stream) {
                        answer_by(stream, request, n + 1, &*reply, &seen);
                    }
                });
            }
        });
        FakeModel {
            port,
            address,
            requests,
            listener: Some(listener),
            stopping,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", SocketAddr::new(self.address, self.port))
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// The base URL of an Anthropic-compatible provider here (Anthropic's client adds `/v1`).
    pub fn anthropic_base_url(&self) -> String {
        format!("http://{}", SocketAddr::new(self.address, self.port))
    }

    /// A `models.json` for pi naming this provider as an Anthropic one, its key read from
    /// `key_variable`.
    pub fn anthropic_models_json(&self, key_variable: &str) -> String {
        json!({"providers": {PROVIDER: {
            "baseUrl": self.anthropic_base_url(),
            "api": "anthropic-messages",
            "apiKey": format!("${key_variable}"),
            "models": [{"id": MODEL, "maxTokens": 4096}],
        }}})
        .to_string()
    }

    /// A `models.json` for pi naming this provider, its key read from `key_variable`.
    pub fn models_json(&self, key_variable: &str) -> String {
        json!({"providers": {PROVIDER: {
            "baseUrl": self.base_url(),
            "api": "openai-completions",
            "apiKey": format!("${key_variable}"),
            "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
            "models": [{"id": MODEL}],
        }}})
        .to_string()
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        if self.listener.take().is_some() {
            self.stopping
                .store(true, std::sync::atomic::Ordering::SeqCst);
            // Wake the accept loop with an empty request so it ends.
            if let Ok(mut s) = TcpStream::connect((self.address, self.port)) {
                let _ = s.write_all(b"POST /stop HTTP/1.1\r\ncontent-length: 0\r\n\r\n");
            }
        }
    }
}

/// Answers a chat request with `step`, in the request's wire format (`n` numbers the answer).
fn chat_answer(
    stream: TcpStream,
    kind: Kind,
    streamed: bool,
    body: &Value,
    n: usize,
    step: &Step,
) -> std::io::Result<()> {
    if kind == Kind::AnthropicChat {
        anthropic_answer(stream, n, step, streamed)
    } else if streamed || kind != Kind::OpenAiChat {
        answer(stream, n, step, chat_usage(body))
    } else {
        openai_json_answer(stream, n, step, chat_usage(body))
    }
}

/// One request of [`FakeModel::serve_by`], kept and answered.
fn answer_by(
    stream: TcpStream,
    request: Request,
    n: usize,
    reply: &(dyn Fn(&Request) -> Reply + Send + Sync),
    seen: &Mutex<Vec<Request>>,
) {
    let (kind, streamed, body) = (request.kind(), request.stream(), request.body.clone());
    let what = match kind {
        Kind::Decisions | Kind::SystemOne | Kind::Images => None,
        _ => Some(reply(&request)),
    };
    seen.lock().unwrap().push(request);
    let _ = match (kind, what) {
        (Kind::Decisions, _) => json_answer(stream, &decisions(&body)),
        (Kind::SystemOne, _) => json_answer(stream, &system_one(&body)),
        (Kind::Images, _) => json_answer(stream, &images(&body)),
        (_, Some(Reply::Step(step))) => chat_answer(stream, kind, streamed, &body, n, &step),
        (_, Some(Reply::Hang)) => {
            // Reads (and drops) whatever comes until the client goes away.
            let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(600)));
            let _ = std::io::copy(&mut &stream, &mut std::io::sink());
            Ok(())
        }
        (_, Some(Reply::Reset) | None) => {
            // SO_LINGER with no time: closing sends RST rather than FIN.
            let linger = nix::libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            let _ =
                nix::sys::socket::setsockopt(&stream, nix::sys::socket::sockopt::Linger, &linger);
            drop(stream);
            Ok(())
        }
    };
}

fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream);
    let mut length = 0usize;
    let mut authorization = None;
    let mut headers = Vec::new();
    let mut path = String::new();
    let mut first = true;
    let mut at = std::time::Instant::now();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if first {
            first = false;
            at = std::time::Instant::now();
            if line.starts_with("POST /stop ") {
                return Some(Request {
                    path: String::new(),
                    authorization: None,
                    headers: Vec::new(),
                    body: Value::Null,
                    at,
                });
            }
            path = line.split(' ').nth(1).unwrap_or_default().to_owned();
            continue;
        }
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            let name = name.to_ascii_lowercase();
            match name.as_str() {
                "content-length" => length = value.parse().ok()?,
                "authorization" => authorization = Some(value.to_owned()),
                _ => {}
            }
            headers.push((name, value.to_owned()));
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        path,
        authorization,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        at,
    })
}

/// What a failing provider says in its error body (tests look for it where it must not be).
pub const ERROR_BODY_CANARY: &str = "cnry-provider-error-7c1";

/// What an OpenAI chat request is billed, as a provider bills it: [`CHAT_USAGE`]'s input, and its
/// output for each of the `n` answers asked for, each cut at the largest output limit the request
/// sets (`max_tokens`, `max_completion_tokens`).
fn chat_usage(body: &Value) -> (u64, u64) {
    let limit = ["max_tokens", "max_completion_tokens"]
        .iter()
        .filter_map(|k| body[k].as_u64())
        .max();
    let one = limit.map_or(CHAT_USAGE.1, |l| CHAT_USAGE.1.min(l));
    let answers = body["n"].as_u64().unwrap_or(1).max(1);
    (CHAT_USAGE.0, one * answers)
}

fn answer(mut stream: TcpStream, n: usize, step: &Step, billed: (u64, u64)) -> std::io::Result<()> {
    if let Step::Status(code) | Step::DownForThisRun(code) = step {
        let body = json!({"error": {"message": format!("refused by the scripted provider ({ERROR_BODY_CANARY})"), "type": "scripted"}}).to_string();
        write!(
            stream,
            "HTTP/1.1 {code} Scripted\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )?;
        return stream.flush();
    }
    let chunk = |delta: Value, finish: Option<&str>, usage: bool| {
        let mut c = json!({
            "id": format!("chatcmpl-{n}"),
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        if usage {
            c["usage"] = openai_usage(billed);
        }
        format!("data: {c}\n\n")
    };
    let mut body = String::new();
    match step {
        Step::Call(name, args) => {
            body.push_str(&chunk(
                json!({"role": "assistant", "tool_calls": [{"index": 0, "id": format!("call-{n}"), "type": "function",
                    "function": {"name": name, "arguments": args.to_string()}}]}),
                None,
                false,
            ));
            body.push_str(&chunk(json!({}), Some("tool_calls"), true));
        }
        Step::Text(text) => {
            body.push_str(&chunk(
                json!({"role": "assistant", "content": text}),
                None,
                false,
            ));
            body.push_str(&chunk(json!({}), Some("stop"), true));
        }
        Step::Status(_) | Step::DownForThisRun(_) => {}
    }
    body.push_str("data: [DONE]\n\n");
    write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

fn openai_usage((input, output): (u64, u64)) -> Value {
    json!({"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output})
}

fn json_answer(mut stream: TcpStream, body: &Value) -> std::io::Result<()> {
    let body = body.to_string();
    write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

fn status_answer(mut stream: TcpStream, code: u16) -> std::io::Result<()> {
    let body = json!({"type": "error", "error": {"message": format!("refused by the scripted provider ({ERROR_BODY_CANARY})"), "type": "scripted"}}).to_string();
    write!(
        stream,
        "HTTP/1.1 {code} Scripted\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

/// A chat completion as one JSON body (a request without `stream`).
fn openai_json_answer(
    stream: TcpStream,
    n: usize,
    step: &Step,
    usage: (u64, u64),
) -> std::io::Result<()> {
    let (message, finish) = match step {
        Step::Status(code) | Step::DownForThisRun(code) => return status_answer(stream, *code),
        Step::Call(name, args) => (
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call-{n}"), "type": "function",
                "function": {"name": name, "arguments": args.to_string()}}]}),
            "tool_calls",
        ),
        Step::Text(text) => (json!({"role": "assistant", "content": text}), "stop"),
    };
    json_answer(
        stream,
        &json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": openai_usage(usage)}),
    )
}

/// An Anthropic message: an event stream when asked for one, else one JSON body.
fn anthropic_answer(
    stream: TcpStream,
    n: usize,
    step: &Step,
    streamed: bool,
) -> std::io::Result<()> {
    let (input, output) = CHAT_USAGE;
    let (block, stop) = match step {
        Step::Status(code) | Step::DownForThisRun(code) => return status_answer(stream, *code),
        Step::Call(name, args) => (
            json!({"type": "tool_use", "id": format!("toolu_{n}"), "name": name, "input": args}),
            "tool_use",
        ),
        Step::Text(text) => (json!({"type": "text", "text": text}), "end_turn"),
    };
    if !streamed {
        return json_answer(
            stream,
            &json!({"id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": MODEL,
                "content": [block], "stop_reason": stop, "stop_sequence": null,
                "usage": {"input_tokens": input, "output_tokens": output}}),
        );
    }
    let (start, delta) = match step {
        Step::Call(name, args) => (
            json!({"type": "tool_use", "id": format!("toolu_{n}"), "name": name, "input": {}}),
            json!({"type": "input_json_delta", "partial_json": args.to_string()}),
        ),
        _ => (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": block["text"]}),
        ),
    };
    let events = [
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": format!("msg_{n}"), "type": "message",
            "role": "assistant", "model": MODEL, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": start}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": output}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    let body: String = events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect();
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

fn classifier_usage() -> Value {
    json!({"input_tokens": CLASSIFIER_USAGE.0, "output_tokens": CLASSIFIER_USAGE.1})
}

/// OpenAI's decisions: every question answered (a predicate true at 0.9, the first choice, the
/// lowest score).
fn decisions(body: &Value) -> Value {
    let answers: Vec<Value> = body["questions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|q| match q["type"].as_str() {
            Some("choice") => {
                let first = q["choices"][0]["value"].clone();
                json!({"name": q["name"], "type": "choice", "choice": first, "confidence": 1,
                    "probabilities": [{"value": first, "probability": 1}]})
            }
            Some("score") => {
                json!({"name": q["name"], "type": "score", "score": 0, "confidence": 1})
            }
            _ => json!({"name": q["name"], "type": "predicate", "probability": 0.9}),
        })
        .collect();
    json!({"id": "decision", "answers": answers, "usage": classifier_usage()})
}

/// TypeSafe's System One: the same answers in its own shape.
fn system_one(body: &Value) -> Value {
    let mut answers = serde_json::Map::new();
    for (id, q) in body["questions"].as_object().into_iter().flatten() {
        let answer = match q["type"].as_str() {
            Some("choice") => {
                let first = q["criteria"]
                    .as_object()
                    .and_then(|c| c.keys().next().cloned())
                    .unwrap_or_default();
                json!({"type": "choice", "choice": first, "confidence": 1, "probabilities": {first: 1}})
            }
            Some("score") => json!({"type": "score", "score": 0, "confidence": 1}),
            _ => json!({"type": "noul", "noul": 0.9}),
        };
        answers.insert(id.clone(), answer);
    }
    json!({"answers": answers, "usage": classifier_usage()})
}

/// OpenRouter's images: one PNG.
fn images(body: &Value) -> Value {
    json!({"id": "gen-1", "object": "chat.completion", "created": 0, "model": body["model"],
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "",
            "images": [{"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG_BASE64}")}}]}}],
        "usage": openai_usage(IMAGE_USAGE)})
}
