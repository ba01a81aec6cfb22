//! pi's side of the hub: one streamable-HTTP endpoint per server (protocol `2025-11-25`), served by
//! the hub itself rather than by rmcp's server, so that a message passes with as few hops as the
//! protocol allows and a result leaves as the server wrote it.
//!
//! - `POST` with `initialize` opens a session (`Mcp-Session-Id`), answered by the hub with the
//!   server's own answer at connect, at a protocol version both sides speak.
//! - `POST` with a request: relayed; the answer is plain JSON, unless something for pi about that
//!   request (its progress, a request the server makes of pi meanwhile) comes first, in which case
//!   the answer is an event stream carrying those messages and then the result.
//! - `POST` with a notification or with pi's answer to a server's request: `202 Accepted`.
//! - `GET`: the session's own event stream, for what the server sends outside pi's requests (one at
//!   a time: a second is refused with `409`).
//! - `DELETE`: ends the session.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ::http::{Method, Request, Response, StatusCode, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::calls::{CallOutcome, ToolCalls, Withheld};
use crate::http::Refusal;
use crate::raw::{self, Edit, Message, RequestParams, event};
use crate::rpc::{Core, ProgressRoute, RpcError, error_bytes};
use crate::session::{PiSession, STREAM_QUEUE, lock};
use crate::upstream::UpstreamEvents;

pub(crate) type HttpBody = BoxBody<Bytes, Infallible>;

/// The largest body pi may post: the limit a server's answer has too.
pub(crate) const MAX_POST_BODY: usize = 16 * 1024 * 1024;

/// How long a request's answer may take before the answer becomes an event stream: its headers go
/// out then, so that pi's client (Node's `fetch` gives up after 300 s without them) keeps waiting.
const STREAM_AFTER: Duration = Duration::from_secs(5);

/// How often an event stream that has nothing to say sends a comment, so that neither pi's client
/// nor anything between gives it up as idle.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
const KEEP_ALIVE_COMMENT: &[u8] = b": keep-alive\n\n";

const SESSION_HEADER: &str = "mcp-session-id";
const EVENT_STREAM: &str = "text/event-stream";
const JSON: &str = "application/json";

/// The protocol versions the hub knows, oldest first: pi may have one of them that is not newer
/// than the server's.
const KNOWN_VERSIONS: [&str; 5] = [
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    "2026-07-28",
];

/// JSON-RPC's codes, as the hub uses them.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;

/// One server as the hub serves it to pi.
pub(crate) struct Served {
    pub(crate) name: String,
    pub(crate) peer: Arc<Core>,
    /// The server's `initialize` result as it wrote it.
    pub(crate) info: Bytes,
    /// The server's protocol version, and where it is in `info`.
    pub(crate) version: (String, std::ops::Range<usize>),
    /// Listed at connect and not withheld.
    pub(crate) allowed: HashSet<String>,
    pub(crate) withheld: Withheld,
    pub(crate) events: UpstreamEvents,
    pub(crate) calls: Arc<ToolCalls>,
}

/// A request that names no session (400), or one that does not exist (404, which tells pi to
/// start a new one).
enum NoSession {
    Missing,
    Unknown,
}

impl NoSession {
    fn response(self) -> Response<HttpBody> {
        match self {
            NoSession::Missing => error_response(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                "Bad Request: Mcp-Session-Id header is required",
            ),
            NoSession::Unknown => {
                error_response(StatusCode::NOT_FOUND, INVALID_REQUEST, "Session not found")
            }
        }
    }
}

/// One server's endpoint: its sessions, and how each of pi's messages is answered.
pub(crate) struct Endpoint {
    served: Arc<Served>,
    sessions: Mutex<HashMap<String, Arc<PiSession>>>,
    /// The hub's: cancelled when it stops, which ends every session.
    stop: CancellationToken,
}

impl Endpoint {
    pub(crate) fn new(served: Served, stop: CancellationToken) -> Endpoint {
        Endpoint {
            served: Arc::new(served),
            sessions: Mutex::new(HashMap::new()),
            stop,
        }
    }

    pub(crate) async fn handle(&self, request: Request<Incoming>) -> Response<HttpBody> {
        match *request.method() {
            Method::POST => self.post(request).await,
            Method::GET => self.get(&request),
            Method::DELETE => self.delete(&request),
            _ => {
                let mut response = status(StatusCode::METHOD_NOT_ALLOWED);
                response.headers_mut().insert(
                    header::ALLOW,
                    header::HeaderValue::from_static("GET, POST, DELETE"),
                );
                response
            }
        }
    }

    /// The session the request names.
    fn session(&self, request: &Request<Incoming>) -> Result<Arc<PiSession>, NoSession> {
        let id = request
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .ok_or(NoSession::Missing)?;
        lock(&self.sessions)
            .get(id)
            .cloned()
            .ok_or(NoSession::Unknown)
    }

    async fn post(&self, request: Request<Incoming>) -> Response<HttpBody> {
        let session = if request.headers().contains_key(SESSION_HEADER) {
            match self.session(&request) {
                Ok(session) => Some(session),
                Err(no) => return no.response(),
            }
        } else {
            None
        };
        let body = match Limited::new(request.into_body(), MAX_POST_BODY)
            .collect()
            .await
        {
            Ok(body) => body.to_bytes(),
            Err(_) => {
                return error_response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    INVALID_REQUEST,
                    "the request body is too large or was cut short",
                );
            }
        };
        let Some(message) = Message::parse(body) else {
            return error_response(StatusCode::BAD_REQUEST, PARSE_ERROR, "Parse error");
        };
        let method = message.method().map(str::to_owned);
        // MCP forbids a null id, and `initialize` must be a request.
        if message.id_is_null() || (method.as_deref() == Some("initialize") && !message.has_id()) {
            return error_response(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                "a request needs an id that is a string or a number",
            );
        }
        match (method.as_deref(), message.has_id(), session) {
            (Some("initialize"), true, None) => self.initialize(&message),
            (Some("initialize"), true, Some(_)) => error_response(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                "the session is already initialized",
            ),
            (_, _, None) => error_response(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                "Bad Request: Mcp-Session-Id header is required",
            ),
            (Some(_), true, Some(session)) => self.request(session, message).await,
            (Some(method), false, Some(session)) => {
                self.notification(&session, method, message).await;
                status(StatusCode::ACCEPTED)
            }
            (None, true, Some(session)) => {
                session.answered(message);
                status(StatusCode::ACCEPTED)
            }
            (None, false, Some(_)) => error_response(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                "not a JSON-RPC message",
            ),
        }
    }

    fn initialize(&self, message: &Message) -> Response<HttpBody> {
        let Some(session_id) = new_session_id() else {
            return error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                INTERNAL_ERROR,
                "no session id could be made",
            );
        };
        let (answer, session) = self.open(message, session_id.clone());
        lock(&self.sessions).insert(session_id.clone(), session);
        let mut response = json_response(answer);
        if let Ok(value) = header::HeaderValue::from_str(&session_id) {
            response.headers_mut().insert(SESSION_HEADER, value);
        }
        response
    }

    /// A new session for pi's `initialize` `message`, attached to the server's events, and the
    /// answer: the server's own at connect, at the version pi asks for when the server speaks it
    /// too, else the server's own.
    fn open(&self, message: &Message, session_id: String) -> (Bytes, Arc<PiSession>) {
        let (server_version, at) = &self.served.version;
        #[derive(serde::Deserialize)]
        struct Asked {
            #[serde(default, rename = "protocolVersion")]
            version: Option<String>,
        }
        let asked = message
            .params()
            .and_then(|p| serde_json::from_slice::<Asked>(p).ok())
            .and_then(|a| a.version);
        let version = asked
            .filter(|asked| {
                asked.as_str() <= server_version.as_str()
                    && KNOWN_VERSIONS.contains(&asked.as_str())
            })
            .unwrap_or_else(|| server_version.clone());
        let version = json!(version).to_string();
        let result = raw::splice(
            &self.served.info,
            vec![Edit::new(at.clone(), version.as_bytes())],
        );
        let id = message.id().unwrap_or_default();
        let session = Arc::new(PiSession::new(session_id, self.stop.child_token()));
        self.served.events.attach(&session);
        (crate::rpc::answer_bytes(&id, Ok(&result)), session)
    }

    async fn notification(&self, session: &PiSession, method: &str, message: Message) {
        match method {
            "notifications/initialized" => {}
            "notifications/cancelled" => {
                if let Some(id) = message.params().and_then(raw::cancelled_request) {
                    session.cancel_call(&id);
                }
            }
            // Progress on a request the server made of pi (under the server's own token), roots
            // changed, anything else: to the server, as pi wrote it.
            _ => {
                let _ = self.served.peer.send(message.bytes().clone()).await;
            }
        }
    }

    /// Relays one of pi's requests and answers it: plain JSON when the answer comes first and soon,
    /// else an event stream (kept alive while the answer is awaited).
    async fn request(&self, session: Arc<PiSession>, message: Message) -> Response<HttpBody> {
        let id = message.id().unwrap_or_default();
        let (stream, mut messages) = mpsc::channel(STREAM_QUEUE);
        let cancel = session.begin_call(&id, &stream, true);
        let served = self.served.clone();
        let call_session = session.clone();
        let call_id = id.clone();
        // Polled here, where pi waits (no task to hop through); relayed and counted to its end
        // even if pi goes away.
        let mut answer = Detached(Some(Box::pin(async move {
            let answer = served.answer(&call_id, message, stream, cancel).await;
            call_session.end_call(&call_id);
            answer
        })));
        let first = tokio::select! {
            biased;
            Some(first) = messages.recv() => Some(first),
            answer = &mut answer => {
                match messages.try_recv() {
                    // Something about the request came just before its result: both go, in order.
                    Ok(first) => {
                        let mut all = vec![event(&first)];
                        while let Ok(next) = messages.try_recv() {
                            all.push(event(&next));
                        }
                        all.push(event(&answer));
                        return event_stream_response(futures::stream::iter(all));
                    }
                    Err(_) => return json_response(answer),
                }
            }
            // A long call: the headers go now, so that pi's client does not give up waiting.
            () = tokio::time::sleep(STREAM_AFTER) => None,
        };
        // The rest as it comes, then the answer; a pi that goes away stops only the sending.
        let sent = stream_the_rest(first, messages, answer);
        event_stream_response(futures::stream::unfold(sent, |mut sent| async move {
            sent.recv().await.map(|bytes| (bytes, sent))
        }))
    }

    fn get(&self, request: &Request<Incoming>) -> Response<HttpBody> {
        let accepts = request
            .headers()
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.contains(EVENT_STREAM) || v.contains("*/*"));
        if !accepts {
            return error_response(
                StatusCode::NOT_ACCEPTABLE,
                INVALID_REQUEST,
                "Not Acceptable: the client must accept text/event-stream",
            );
        }
        let session = match self.session(request) {
            Ok(session) => session,
            Err(no) => return no.response(),
        };
        let (stream, messages) = mpsc::channel(STREAM_QUEUE);
        {
            let mut standalone = lock(&session.standalone);
            if standalone.as_ref().is_some_and(|s| !s.is_closed()) {
                return error_response(
                    StatusCode::CONFLICT,
                    INVALID_REQUEST,
                    "Conflict: the session's stream is already open",
                );
            }
            for waiting in lock(&session.waiting).drain(..) {
                let _ = stream.try_send(waiting);
            }
            *standalone = Some(stream);
        }
        let ended = session.ended.clone();
        let body = futures::stream::unfold(
            (messages, ended, keep_alive()),
            |(mut messages, ended, mut beat)| async move {
                let bytes = tokio::select! {
                    message = messages.recv() => event(&message?),
                    _ = beat.tick() => Bytes::from_static(KEEP_ALIVE_COMMENT),
                    () = ended.cancelled() => return None,
                };
                Some((bytes, (messages, ended, beat)))
            },
        );
        event_stream_response(body)
    }

    fn delete(&self, request: &Request<Incoming>) -> Response<HttpBody> {
        let session = match self.session(request) {
            Ok(session) => session,
            Err(no) => return no.response(),
        };
        lock(&self.sessions).remove(&session.id);
        session.ended.cancel();
        status(StatusCode::OK)
    }
}

/// A call's answer over a stream session, as the loop polls it.
type LineCall = Pin<Box<dyn Future<Output = Bytes> + Send>>;

impl Endpoint {
    /// One session over a stream of newline-delimited messages (the stdio framing), which the
    /// relay pi starts carries over the hub's socket: `initialize` first, then every message as
    /// over HTTP, and everything for pi on the one stream. pi's requests are relayed side by side
    /// and polled here, with no task to hop through; the session ends when pi's side closes (its
    /// requests still in flight are then cancelled at the server) or the hub stops.
    pub(crate) async fn serve_lines<R, W>(&self, mut lines: raw::LineReader<R>, writer: W)
    where
        R: tokio::io::AsyncRead + Unpin,
        W: tokio::io::AsyncWrite + Unpin,
    {
        use futures::StreamExt;
        let (out, mut queue) = mpsc::channel::<Bytes>(STREAM_QUEUE);
        let mut writer = Lines::new(writer);
        let mut session: Option<Arc<PiSession>> = None;
        let mut calls = futures::stream::FuturesUnordered::<LineCall>::new();
        let mut reading = true;
        loop {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => break,
                Some(answer) = calls.next(), if !calls.is_empty() => {
                    // What came about the request before its result goes first.
                    while let Ok(message) = queue.try_recv() {
                        writer.put(&message).await;
                    }
                    writer.put(&answer).await;
                }
                Some(message) = queue.recv() => writer.put(&message).await,
                line = lines.next(), if reading => match line {
                    None => {
                        reading = false;
                        if let Some(session) = &session {
                            *lock(&session.standalone) = None;
                            session.ended.cancel();
                        }
                    }
                    Some(line) => {
                        if let Some(reply) = self.take_line(line, &mut session, &out, &mut calls).await {
                            writer.put(&reply).await;
                        }
                    }
                },
            }
            writer.flush().await;
            if writer.broken && reading {
                // pi's side is gone: nothing more can reach it.
                reading = false;
                if let Some(session) = &session {
                    *lock(&session.standalone) = None;
                    session.ended.cancel();
                }
            }
            if !reading && calls.is_empty() {
                break;
            }
        }
        if let Some(session) = session {
            *lock(&session.standalone) = None;
            session.ended.cancel();
        }
    }

    /// One line from pi: what to answer at once, if anything; a request to relay goes on `calls`.
    async fn take_line(
        &self,
        line: raw::Line,
        session: &mut Option<Arc<PiSession>>,
        out: &mpsc::Sender<Bytes>,
        calls: &mut futures::stream::FuturesUnordered<LineCall>,
    ) -> Option<Bytes> {
        let message = match line_message(line) {
            Ok(message) => message,
            Err(answer) => return answer,
        };
        let method = message.method().map(str::to_owned);
        let id = message.id().unwrap_or_default();
        match (method.as_deref(), message.has_id(), session.as_ref()) {
            (Some("initialize"), true, None) => {
                let (answer, opened) = self.open(&message, String::new());
                *lock(&opened.standalone) = Some(out.clone());
                *session = Some(opened);
                Some(answer)
            }
            (Some("initialize"), true, Some(_)) => Some(error_bytes(
                &id,
                INVALID_REQUEST,
                "the session is already initialized",
            )),
            (Some(_), true, None) => Some(error_bytes(
                &id,
                INVALID_REQUEST,
                "the session is not initialized",
            )),
            // Before `initialize`, a notification or an answer has nothing to go to.
            (_, _, None) => None,
            (Some(_), true, Some(open)) => {
                self.start_call(open, id, message, out, calls);
                None
            }
            (Some(method), false, Some(open)) => {
                self.notification(open, method, message).await;
                None
            }
            (None, true, Some(open)) => {
                open.answered(message);
                None
            }
            (None, false, Some(_)) => Some(error_bytes(
                b"null",
                INVALID_REQUEST,
                "not a JSON-RPC message",
            )),
        }
    }

    /// Starts answering the request `message` (`id`) of the session `open`: in the session's
    /// order, cancelled with it, its answer streamed on `out`.
    fn start_call(
        &self,
        open: &Arc<PiSession>,
        id: Bytes,
        message: Message,
        out: &mpsc::Sender<Bytes>,
        calls: &mut futures::stream::FuturesUnordered<LineCall>,
    ) {
        let cancel = open.begin_call(&id, out, false);
        let served = self.served.clone();
        let open = open.clone();
        let stream = out.clone();
        calls.push(Box::pin(async move {
            let answer = served.answer(&id, message, stream, cancel).await;
            open.end_call(&id);
            answer
        }));
    }
}

/// The message of one line pi's relay sent, or what to answer instead (`None`: nothing, for a
/// blank line): a line too long, one that is not JSON-RPC, or a request whose id is null.
pub(crate) fn line_message(line: raw::Line) -> Result<Message, Option<Bytes>> {
    let bytes = match line {
        raw::Line::Whole(bytes) => bytes,
        raw::Line::TooLong { id } => {
            let id = id.unwrap_or_else(|| Bytes::from_static(b"null"));
            return Err(Some(error_bytes(
                &id,
                INVALID_REQUEST,
                "the message is too large",
            )));
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(None);
    }
    let Some(message) = Message::parse(bytes) else {
        return Err(Some(error_bytes(b"null", PARSE_ERROR, "Parse error")));
    };
    let initialize = message.method() == Some("initialize");
    if message.id_is_null() || (initialize && !message.has_id()) {
        return Err(Some(error_bytes(
            b"null",
            INVALID_REQUEST,
            "a request needs an id that is a string or a number",
        )));
    }
    Ok(message)
}

/// Messages written one to a line. A message a server wrote over several lines has its line
/// ends turned into spaces: outside a string they are whitespace, and JSON allows none inside one.
struct Lines<W> {
    inner: tokio::io::BufWriter<W>,
    /// A write failed: pi's side is gone, and nothing more is written.
    broken: bool,
}

impl<W: tokio::io::AsyncWrite + Unpin> Lines<W> {
    fn new(inner: W) -> Lines<W> {
        Lines {
            inner: tokio::io::BufWriter::new(inner),
            broken: false,
        }
    }

    async fn put(&mut self, message: &[u8]) {
        use tokio::io::AsyncWriteExt as _;
        if self.broken {
            return;
        }
        let one_line = one_line(message);
        if self.inner.write_all(&one_line).await.is_err()
            || self.inner.write_all(b"\n").await.is_err()
        {
            self.broken = true;
        }
    }

    async fn flush(&mut self) {
        use tokio::io::AsyncWriteExt as _;
        if !self.broken && self.inner.flush().await.is_err() {
            self.broken = true;
        }
    }
}

/// `message` without line ends (see [`Lines`]).
pub(crate) fn one_line(message: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if memchr::memchr2(b'\n', b'\r', message).is_none() {
        return std::borrow::Cow::Borrowed(message);
    }
    std::borrow::Cow::Owned(
        message
            .iter()
            .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b })
            .collect(),
    )
}

impl Served {
    /// pi's request `message` (id `id`, as pi wrote it) relayed, as the whole JSON-RPC answer to
    /// send pi.
    async fn answer(
        &self,
        id: &[u8],
        message: Message,
        stream: mpsc::Sender<Bytes>,
        cancel: CancellationToken,
    ) -> Bytes {
        let method = message.method().unwrap_or_default();
        let (tool, params) = match self.gate(id, method, message.params()) {
            Ok(gated) => gated,
            Err(refused) => return refused,
        };
        let lists_tools = method == "tools/list";
        let started = Instant::now();
        let answer = self.relay(&message, &params, stream, cancel).await;
        let took = started.elapsed();
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                if let Some(tool) = &tool {
                    self.calls
                        .record(&self.name, tool, true, CallOutcome::Error, took, 0);
                }
                return error_bytes(id, INTERNAL_ERROR, relay_error(&e));
            }
        };
        if let Some(tool) = &tool {
            let (outcome, bytes) = match answer.result() {
                Some(result) if raw::is_error_result(result) => (CallOutcome::Error, result.len()),
                Some(result) => (CallOutcome::Ok, result.len()),
                None => (CallOutcome::Error, 0),
            };
            self.calls
                .record(&self.name, tool, true, outcome, took, bytes);
        }
        let listed = lists_tools
            .then(|| answer.result())
            .flatten()
            .and_then(|result| raw::filter_tools(result, |name| self.allowed.contains(name)));
        let mut edits: Vec<Edit<'_>> = answer.id_edit(id).into_iter().collect();
        if let Some((at, tools)) = &listed
            && let Some(start) = answer.result_start()
        {
            edits.push(Edit::new(at.clone(), tools).shifted(start));
        }
        answer.edited(edits)
    }

    /// What a request may go on as: its tool, for a `tools/call`, and its parameters read. A call
    /// of a tool the job withholds or the server did not list, and parameters that cannot be read,
    /// are answered here (and a refused call counted).
    fn gate(
        &self,
        id: &[u8],
        method: &str,
        params: Option<&[u8]>,
    ) -> Result<(Option<String>, RequestParams), Bytes> {
        let params = RequestParams::read(params);
        let tool = (method == "tools/call").then(|| {
            match &params {
                Ok(p) => p.name.clone(),
                Err(e) => e.name().map(str::to_owned),
            }
            .unwrap_or_default()
        });
        // Counted under its own name only when the server listed it (or the job withholds it).
        let known = |tool: &str| self.withheld.contains(tool) || self.allowed.contains(tool);
        let refuse = |tool: &str, code: i64, words: &str| {
            self.calls.record(
                &self.name,
                tool,
                known(tool),
                CallOutcome::Refused,
                Duration::ZERO,
                0,
            );
            error_bytes(id, code, words)
        };
        if let Some(tool) = &tool {
            if self.withheld.contains(tool) {
                let words = format!("tool {tool} is withheld from this job");
                return Err(refuse(tool, INVALID_PARAMS, &words));
            }
            if !self.allowed.contains(tool) {
                return Err(refuse(
                    tool,
                    INVALID_PARAMS,
                    "unknown tool: the server did not list it",
                ));
            }
        }
        match params {
            Ok(params) => Ok((tool, params)),
            Err(e) => {
                let words = e.to_string();
                Err(match &tool {
                    Some(tool) => refuse(tool, INVALID_REQUEST, &words),
                    None => error_bytes(id, INVALID_REQUEST, &words),
                })
            }
        }
    }

    /// Sends pi's request to the server under an id of the hub's (and, when pi asked for
    /// progress, a token of the hub's: the same number) and waits for the server's answer, as the
    /// server wrote it. The request's progress goes to `stream` under pi's token meanwhile;
    /// `cancel` cancels it at the server.
    async fn relay(
        &self,
        message: &Message,
        params: &RequestParams,
        stream: mpsc::Sender<Bytes>,
        cancel: CancellationToken,
    ) -> Result<Message, RpcError> {
        let upstream_id = self.peer.next_id();
        let (request, token) = upstream_request(message, params, &upstream_id.to_string());
        let route = token.map(|token| ProgressRoute { stream, token });
        tokio::select! {
            answer = self.peer.call(upstream_id, request, route) => answer,
            () = cancel.cancelled() => {
                let cancelled = json!({
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": {"requestId": upstream_id, "reason": "the request was cancelled"}
                });
                let _ = self.peer.send(Bytes::from(cancelled.to_string())).await;
                Err(RpcError::Cancelled)
            }
        }
    }
}

/// pi's request as the server gets it: under the hub's id `id_text`, and, when pi asked for
/// progress, with pi's token swapped for the same text; also pi's token, to route the progress back.
pub(crate) fn upstream_request(
    message: &Message,
    params: &RequestParams,
    id_text: &str,
) -> (Bytes, Option<Bytes>) {
    let mut edits: Vec<Edit<'_>> = message.id_edit(id_text.as_bytes()).into_iter().collect();
    let mut token = None;
    if let (Some(at), Some(start), Some(params_bytes)) = (
        params.progress_token.clone(),
        message.params_start(),
        message.params(),
    ) {
        token = Some(Bytes::copy_from_slice(&params_bytes[at.clone()]));
        edits.push(Edit::new(at, id_text.as_bytes()).shifted(start));
    }
    (message.edited(edits), token)
}

/// What pi is told when a request got no answer from the server.
fn relay_error(e: &RpcError) -> &'static str {
    match e {
        RpcError::Closed => "the connection is closed",
        RpcError::Cancelled => "the request was cancelled",
        RpcError::Transport(Refusal::BodyTooLarge(_)) => {
            "the server's answer is larger than the hub takes (16 MiB)"
        }
        _ => "the request could not be relayed",
    }
}

/// Sends, as server-sent events on a channel of its own, `first`, then the request's messages as
/// they come with a comment now and then to keep the stream alive, then `answer`. A receiver that
/// goes away stops only the sending.
fn stream_the_rest(
    first: Option<Bytes>,
    mut messages: mpsc::Receiver<Bytes>,
    mut answer: Detached,
) -> mpsc::Receiver<Bytes> {
    let (out, sent) = mpsc::channel(STREAM_QUEUE);
    tokio::spawn(async move {
        if let Some(first) = first
            && out.send(event(&first)).await.is_err()
        {
            return;
        }
        let mut beat = keep_alive();
        loop {
            tokio::select! {
                biased;
                Some(next) = messages.recv() => {
                    if out.send(event(&next)).await.is_err() {
                        return;
                    }
                }
                answer = &mut answer => {
                    while let Ok(next) = messages.try_recv() {
                        let _ = out.send(event(&next)).await;
                    }
                    let _ = out.send(event(&answer)).await;
                    return;
                }
                _ = beat.tick() => {
                    if out.send(Bytes::from_static(KEEP_ALIVE_COMMENT)).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    sent
}

/// A call's answer, polled where pi waits for it. If pi goes away first (the future is dropped
/// unfinished), what is left of it goes on in a task of its own, so that the call is relayed and
/// counted to its end.
struct Detached(Option<Pin<Box<dyn Future<Output = Bytes> + Send>>>);

impl Future for Detached {
    type Output = Bytes;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Bytes> {
        let Some(rest) = self.0.as_mut() else {
            return Poll::Pending;
        };
        let answer = std::task::ready!(rest.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(answer)
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        if let Some(rest) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(rest);
        }
    }
}

/// A fresh session id: 128 random bits, in hex.
fn new_session_id() -> Option<String> {
    protocol::ids::random_hex::<16>().ok()
}

pub(crate) fn status(code: StatusCode) -> Response<HttpBody> {
    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = code;
    response
}

fn json_response(message: Bytes) -> Response<HttpBody> {
    let mut response = Response::new(Full::new(message).boxed());
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(JSON));
    response
}

/// An HTTP error carrying a JSON-RPC error without an id.
fn error_response(code: StatusCode, rpc: i64, message: &'static str) -> Response<HttpBody> {
    let body = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": rpc, "message": message}
    });
    let mut response = json_response(Bytes::from(body.to_string()));
    *response.status_mut() = code;
    response
}

/// Ticks every [`KEEP_ALIVE`], the first one [`KEEP_ALIVE`] from now.
fn keep_alive() -> tokio::time::Interval {
    tokio::time::interval_at(tokio::time::Instant::now() + KEEP_ALIVE, KEEP_ALIVE)
}

fn event_stream_response<S>(events: S) -> Response<HttpBody>
where
    S: futures::Stream<Item = Bytes> + Send + Sync + 'static,
{
    use futures::StreamExt;
    let frames = events.map(|bytes| Ok::<_, Infallible>(Frame::data(bytes)));
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(frames)));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(EVENT_STREAM),
    );
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test]
    async fn an_answer_dropped_unfinished_goes_on_to_its_end() {
        let done = Arc::new(AtomicBool::new(false));
        let finished = done.clone();
        let mut answer = Detached(Some(Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            finished.store(true, Ordering::SeqCst);
            Bytes::new()
        })));
        // Polled once, then given up on (pi went away).
        assert!(
            tokio::time::timeout(Duration::from_millis(5), &mut answer)
                .await
                .is_err()
        );
        drop(answer);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(done.load(Ordering::SeqCst));

        // One that finished is not run again.
        let answer = Detached(Some(Box::pin(async { Bytes::from_static(b"x") })));
        assert_eq!(&answer.await[..], b"x");
    }
}
