//! A scripted model provider: an OpenAI-compatible `/v1/chat/completions` on a loopback port (or a
//! test host's),
//! answering each request with the next step of its script as a streamed chunk sequence (a tool
//! call, or text), and keeping every request it received for the test to read.
//!
//! pi reaches it through a provider in `models.json` (see [`FakeModel::models_json`]). Only what
//! cannot run here (a real model) is faked; pi, its HTTP client and the wire format are real.

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
    /// The request's `Authorization` header, if any.
    pub authorization: Option<String>,
    pub body: Value,
}

impl Request {
    /// The names of the tools declared to the model.
    pub fn tools(&self) -> Vec<String> {
        self.body["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
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
}

/// The provider name pi knows the fake by, and its model id.
pub const PROVIDER: &str = "fake";
pub const MODEL: &str = "fake-model";

impl FakeModel {
    pub fn start(script: Vec<Step>) -> FakeModel {
        FakeModel::start_on(0, script)
    }

    /// Listens on `port` of 127.0.0.1 (0: any free port).
    pub fn start_on(port: u16, script: Vec<Step>) -> FakeModel {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("the port is free");
        FakeModel::serve(listener, Ipv4Addr::LOCALHOST.into(), script)
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
                seen.lock().unwrap().push(request);
                let step = script
                    .get(next)
                    .cloned()
                    .unwrap_or_else(|| Step::text("done"));
                next += 1;
                let _ = answer(stream, next, &step);
            }
        });
        FakeModel {
            port,
            address,
            requests,
            listener: Some(listener),
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", SocketAddr::new(self.address, self.port))
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
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
            // Wake the accept loop with an empty request so it ends.
            if let Ok(mut s) = TcpStream::connect((self.address, self.port)) {
                let _ = s.write_all(b"POST /stop HTTP/1.1\r\ncontent-length: 0\r\n\r\n");
            }
        }
    }
}

fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream);
    let mut length = 0usize;
    let mut authorization = None;
    let mut first = true;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if first {
            first = false;
            if line.starts_with("POST /stop ") {
                return Some(Request {
                    authorization: None,
                    body: Value::Null,
                });
            }
            continue;
        }
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse().ok()?,
                "authorization" => authorization = Some(value.to_owned()),
                _ => {}
            }
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        authorization,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    })
}

/// What a failing provider says in its error body (tests look for it where it must not be).
pub const ERROR_BODY_CANARY: &str = "cnry-provider-error-7c1";

fn answer(mut stream: TcpStream, n: usize, step: &Step) -> std::io::Result<()> {
    if let Step::Status(code) = step {
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
            c["usage"] =
                json!({"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120});
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
        Step::Status(_) => {}
    }
    body.push_str("data: [DONE]\n\n");
    write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}
