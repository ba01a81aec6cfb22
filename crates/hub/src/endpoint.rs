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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::http::{Method, Request, Response, StatusCode, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use rmcp::model::{
    CancelledNotification, CancelledNotificationParam, ClientNotification, ClientRequest,
    CustomNotification, CustomRequest, ErrorCode, InitializeResult, ProtocolVersion,
};
use rmcp::service::PeerRequestOptions;
use rmcp::{ErrorData as McpError, Peer, RoleClient, ServiceError};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::calls::{Outcome, ToolCalls, Withheld};
use crate::session::{Call, PiSession, STREAM_QUEUE, lock};
use crate::upstream::{ProgressRoute, UpstreamEvents};

pub(crate) type HttpBody = BoxBody<Bytes, Infallible>;

/// The largest body pi may post: the limit a server's answer has too.
const MAX_POST_BODY: usize = 16 * 1024 * 1024;

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

/// One server as the hub serves it to pi.
pub(crate) struct Served {
    pub(crate) name: String,
    pub(crate) peer: Peer<RoleClient>,
    pub(crate) info: InitializeResult,
    /// The same, as the server wrote it, when its transport kept it.
    pub(crate) raw_info: Option<Value>,
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
                ErrorCode::INVALID_REQUEST,
                "Bad Request: Mcp-Session-Id header is required",
            ),
            NoSession::Unknown => error_response(
                StatusCode::NOT_FOUND,
                ErrorCode::INVALID_REQUEST,
                "Session not found",
            ),
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
                    ErrorCode::INVALID_REQUEST,
                    "the request body is too large or was cut short",
                );
            }
        };
        let Ok(message) = serde_json::from_slice::<Value>(&body) else {
            return error_response(
                StatusCode::BAD_REQUEST,
                ErrorCode::PARSE_ERROR,
                "Parse error",
            );
        };
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let id = message.get("id").cloned();
        // MCP forbids a null id, and `initialize` must be a request.
        if id == Some(Value::Null) || (method.as_deref() == Some("initialize") && id.is_none()) {
            return error_response(
                StatusCode::BAD_REQUEST,
                ErrorCode::INVALID_REQUEST,
                "a request needs an id that is a string or a number",
            );
        }
        match (method.as_deref(), id, session) {
            (Some("initialize"), Some(id), None) => self.initialize(id, &message),
            (Some("initialize"), Some(_), Some(_)) => error_response(
                StatusCode::BAD_REQUEST,
                ErrorCode::INVALID_REQUEST,
                "the session is already initialized",
            ),
            (_, _, None) => error_response(
                StatusCode::BAD_REQUEST,
                ErrorCode::INVALID_REQUEST,
                "Bad Request: Mcp-Session-Id header is required",
            ),
            (Some(_), Some(id), Some(session)) => self.request(session, id, message).await,
            (Some(method), None, Some(session)) => {
                self.notification(&session, method, message).await;
                status(StatusCode::ACCEPTED)
            }
            (None, Some(_), Some(session)) => {
                session.answered(message);
                status(StatusCode::ACCEPTED)
            }
            (None, None, Some(_)) => error_response(
                StatusCode::BAD_REQUEST,
                ErrorCode::INVALID_REQUEST,
                "not a JSON-RPC message",
            ),
        }
    }

    fn initialize(&self, id: Value, message: &Value) -> Response<HttpBody> {
        let info = &self.served.info;
        let server_version = info.protocol_version.to_string();
        // The version pi asks for when the server speaks it too, else the server's own.
        let version = message["params"]["protocolVersion"]
            .as_str()
            .filter(|asked| {
                *asked <= server_version.as_str()
                    && ProtocolVersion::KNOWN_VERSIONS
                        .iter()
                        .any(|known| known.to_string() == *asked)
            })
            .unwrap_or(&server_version)
            .to_owned();
        let result = match &self.served.raw_info {
            Some(raw) => Ok(raw.clone()),
            None => serde_json::to_value(info),
        };
        let Ok(mut result) = result else {
            return error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::INTERNAL_ERROR,
                "the server's answer cannot be sent",
            );
        };
        result["protocolVersion"] = Value::String(version);
        let Some(session_id) = new_session_id() else {
            return error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::INTERNAL_ERROR,
                "no session id could be made",
            );
        };
        let session = Arc::new(PiSession::new(session_id.clone(), self.stop.child_token()));
        self.served.events.attach(&session);
        lock(&self.sessions).insert(session_id.clone(), session);
        let mut response = json_response(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
        if let Ok(value) = header::HeaderValue::from_str(&session_id) {
            response.headers_mut().insert(SESSION_HEADER, value);
        }
        response
    }

    async fn notification(&self, session: &PiSession, method: &str, message: Value) {
        match method {
            "notifications/initialized" => {}
            "notifications/cancelled" => {
                if let Some(id) = message["params"].get("requestId") {
                    session.cancel_call(id);
                }
            }
            // Progress on a request the server made of pi (under the server's own token), roots
            // changed, anything else: to the server.
            _ => {
                if let Ok(notification) =
                    serde_json::from_value::<CustomNotification>(method_and_params(&message))
                {
                    let _ = self
                        .served
                        .peer
                        .send_notification(ClientNotification::CustomNotification(notification))
                        .await;
                }
            }
        }
    }

    /// Relays one of pi's requests and answers it: plain JSON when the answer comes first and soon,
    /// else an event stream (kept alive while the answer is awaited).
    async fn request(
        &self,
        session: Arc<PiSession>,
        id: Value,
        message: Value,
    ) -> Response<HttpBody> {
        let (stream, mut messages) = mpsc::channel(STREAM_QUEUE);
        let cancel = session.ended.child_token();
        {
            // The order of `deliver_in_order`.
            let standalone = lock(&session.standalone);
            lock(&session.calls).push(Call {
                id: id.clone(),
                stream: stream.clone(),
                cancel: cancel.clone(),
            });
            // What waited for a stream goes on this one while the session has none of its own.
            if standalone.as_ref().is_none_or(mpsc::Sender::is_closed) {
                for waiting in lock(&session.waiting).drain(..) {
                    let _ = stream.try_send(waiting);
                }
            }
        }
        let served = self.served.clone();
        let call_session = session.clone();
        let call_id = id.clone();
        // A task of its own: the call is relayed (and counted) to its end even if pi goes away.
        let mut answer = tokio::spawn(async move {
            let answer = served.answer(&call_id, message, stream, cancel).await;
            call_session.end_call(&call_id);
            answer
        });
        let first = tokio::select! {
            biased;
            Some(first) = messages.recv() => Some(first),
            answer = &mut answer => {
                let answer = answer.unwrap_or_else(|_| internal_error(&id, "the relay failed"));
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
                    Err(_) => return json_response(&answer),
                }
            }
            // A long call: the headers go now, so that pi's client does not give up waiting.
            () = tokio::time::sleep(STREAM_AFTER) => None,
        };
        // The rest as it comes, then the answer; a pi that goes away stops only the sending.
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
                        let answer = answer.unwrap_or_else(|_| internal_error(&id, "the relay failed"));
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
                ErrorCode::INVALID_REQUEST,
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
                    ErrorCode::INVALID_REQUEST,
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

impl Served {
    /// pi's request `message` (id `id`) relayed, as the whole JSON-RPC answer to send pi.
    async fn answer(
        &self,
        id: &Value,
        message: Value,
        stream: mpsc::Sender<Value>,
        cancel: CancellationToken,
    ) -> Value {
        let pi_token = message["params"]["_meta"].get("progressToken").cloned();
        let tool = (message["method"] == "tools/call")
            .then(|| message["params"]["name"].as_str().map(str::to_owned))
            .map(Option::unwrap_or_default);
        let lists_tools = message["method"] == "tools/list";
        if let Some(tool) = tool {
            return self
                .call(id, &tool, &message, pi_token, stream, cancel)
                .await;
        }
        let request = match as_sent(&message) {
            Ok(request) => request,
            Err(e) => return error_message(id, &e),
        };
        match self.relay(request, pi_token, stream, cancel).await {
            Ok(mut result) => {
                if lists_tools && let Some(Value::Array(tools)) = result.get_mut("tools") {
                    tools.retain(|tool| {
                        tool.get("name")
                            .and_then(Value::as_str)
                            .is_some_and(|name| self.allowed.contains(name))
                    });
                }
                json!({"jsonrpc": "2.0", "id": id, "result": result})
            }
            Err(e) => error_message(id, &e),
        }
    }

    async fn call(
        &self,
        id: &Value,
        tool: &str,
        message: &Value,
        pi_token: Option<Value>,
        stream: mpsc::Sender<Value>,
        cancel: CancellationToken,
    ) -> Value {
        let refuse = |message: String| {
            self.calls
                .record(&self.name, tool, Outcome::Refused, Duration::ZERO, 0);
            error_message(id, &McpError::invalid_params(message, None))
        };
        if self.withheld.contains(tool) {
            return refuse(format!("tool {tool} is withheld from this job"));
        }
        if !self.allowed.contains(tool) {
            return refuse(format!("unknown tool {tool}: the server did not list it"));
        }
        let request = match as_sent(message) {
            Ok(request) => request,
            Err(e) => {
                self.calls
                    .record(&self.name, tool, Outcome::Refused, Duration::ZERO, 0);
                return error_message(id, &e);
            }
        };
        let started = Instant::now();
        let answer = self.relay(request, pi_token, stream, cancel).await;
        let took = started.elapsed();
        match answer {
            Ok(result) => {
                let bytes = serde_json::to_vec(&result).map_or(0, |b| b.len());
                let outcome = if result.get("isError") == Some(&Value::Bool(true)) {
                    Outcome::Error
                } else {
                    Outcome::Ok
                };
                self.calls.record(&self.name, tool, outcome, took, bytes);
                json!({"jsonrpc": "2.0", "id": id, "result": result})
            }
            Err(e) => {
                self.calls.record(&self.name, tool, Outcome::Error, took, 0);
                error_message(id, &e)
            }
        }
    }

    /// Sends `request` to the server and waits for its result, as the server wrote it (rmcp's
    /// reading of it when the transport did not keep it). The request's progress goes to `stream`
    /// under pi's token meanwhile; `cancel` cancels it at the server. The result waits until the
    /// notifications the server sent before it have been passed on.
    async fn relay(
        &self,
        request: ClientRequest,
        pi_token: Option<Value>,
        stream: mpsc::Sender<Value>,
        cancel: CancellationToken,
    ) -> Result<Value, McpError> {
        let shared = self.events.shared();
        let mut routes = shared.progress.lock().await;
        let handle = self
            .peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
            .map_err(relay_error)?;
        let token = handle.progress_token.clone();
        if let Some(pi_token) = pi_token {
            routes.insert(
                token.clone(),
                ProgressRoute {
                    stream,
                    token: pi_token,
                },
            );
        }
        drop(routes);
        let id = handle.id.clone();
        let answer = tokio::select! {
            answer = handle.await_response() => answer.map_err(relay_error),
            () = cancel.cancelled() => {
                // A result the server sends anyway is not kept.
                self.events.raw().forget(&id);
                let cancelled = CancelledNotification::new(CancelledNotificationParam::new(
                    Some(id.clone()),
                    Some("the request was cancelled".to_owned()),
                ));
                let _ = self.peer.send_notification(cancelled.into()).await;
                Err(McpError::internal_error("the request was cancelled", None))
            }
        };
        shared.flush().await;
        shared.progress.lock().await.remove(&token);
        let raw = self.events.raw().take(&id);
        let typed = answer?;
        Ok(match raw {
            Some(raw) => raw,
            None => serde_json::to_value(typed).map_err(|_| {
                McpError::internal_error("the server's answer cannot be sent", None)
            })?,
        })
    }
}

fn relay_error(e: ServiceError) -> McpError {
    match e {
        // The server's own error passes through unchanged.
        ServiceError::McpError(e) => e,
        ServiceError::TransportClosed => McpError::internal_error("the connection is closed", None),
        ServiceError::Cancelled { .. } => {
            McpError::internal_error("the request was cancelled", None)
        }
        _ => McpError::internal_error("the request could not be relayed", None),
    }
}

/// pi's request as the server is sent it: pi's method and params as pi wrote them (rmcp adds only
/// its own progress token to `_meta`).
fn as_sent(message: &Value) -> Result<ClientRequest, McpError> {
    serde_json::from_value::<CustomRequest>(method_and_params(message))
        .map(ClientRequest::CustomRequest)
        .map_err(|_| McpError::invalid_request("the request's params are not an object", None))
}

/// A message's `method` and `params`, the shape rmcp reads a request or notification it does not
/// model from. Without params, `{}`: rmcp would send `"params": null`, which servers refuse.
fn method_and_params(message: &Value) -> Value {
    json!({
        "method": message.get("method").cloned().unwrap_or(Value::Null),
        "params": message.get("params").cloned().unwrap_or_else(|| json!({})),
    })
}

/// The JSON-RPC error answer to request `id`.
fn error_message(id: &Value, error: &McpError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

fn internal_error(id: &Value, message: &'static str) -> Value {
    error_message(id, &McpError::internal_error(message, None))
}

/// A fresh session id: 128 random bits, in hex.
fn new_session_id() -> Option<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

pub(crate) fn status(code: StatusCode) -> Response<HttpBody> {
    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = code;
    response
}

fn json_response(message: &Value) -> Response<HttpBody> {
    let body = serde_json::to_vec(message).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(JSON));
    response
}

/// An HTTP error carrying a JSON-RPC error without an id.
fn error_response(code: StatusCode, rpc: ErrorCode, message: &'static str) -> Response<HttpBody> {
    let mut response = json_response(&json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": rpc.0, "message": message}
    }));
    *response.status_mut() = code;
    response
}

/// One message as an event of a stream.
fn event(message: &Value) -> Bytes {
    let mut event = b"event: message\ndata: ".to_vec();
    event.extend(serde_json::to_vec(message).unwrap_or_default());
    event.extend_from_slice(b"\n\n");
    Bytes::from(event)
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
