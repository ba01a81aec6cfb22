//! The hub's JSON-RPC client of one server, over the server's standard input and output or over
//! streamable HTTP ([`crate::http`]). It keeps each message as the server wrote it
//! ([`crate::raw::Message`]) and reads only what routes it:
//!
//! - an answer goes to the request it answers, by id: every request sent upstream carries an id
//!   the hub gave (a number, counted per connection), so that the sessions pi opens with one
//!   server never mix up their ids;
//! - a progress notification goes to the request whose token it carries (the hub's id for it,
//!   which replaced pi's token on the way up), with pi's token put back;
//! - the server's requests of the client go to pi's attached session under an id of the hub's,
//!   and pi's answer back under the server's own; a `ping` is answered here;
//! - any other notification goes to pi's attached session as it came.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::http::{HttpFault, HttpTransport, Inbound, Refusal};
use crate::raw::{self, Line, LineReader, Message};
use crate::upstream::UpstreamEvents;

/// Why a request to the server got no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The server answered with a JSON-RPC error (its code; its message is not kept here, as it
    /// could echo a value).
    #[error("the server answered with JSON-RPC error {code}")]
    Server { code: i64 },
    #[error("the connection to the server is closed")]
    Closed,
    /// What the HTTP client refused, or an answer over the size limit.
    #[error("{0}")]
    Transport(#[source] Refusal),
    #[error("the server's answer is not a JSON-RPC answer with a result")]
    Malformed,
    /// The hub gave up on the request (pi cancelled it).
    #[error("the request was cancelled")]
    Cancelled,
}

/// A client of one connected server. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct Peer(pub(crate) Arc<Core>);

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("closed", &self.0.closed.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Peer {
    /// Sends request `method` with `params` to the server and waits for its result.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.0.next_id();
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let bytes = serde_json::to_vec(&request).map_err(|_| RpcError::Malformed)?;
        let answer = self.0.call(id, Bytes::from(bytes), None).await?;
        result_of(&answer)
    }

    /// Sends notification `method` with `params` to the server.
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), RpcError> {
        let notification = json!({"jsonrpc": "2.0", "method": method, "params": params});
        let bytes = serde_json::to_vec(&notification).map_err(|_| RpcError::Malformed)?;
        self.0.send(Bytes::from(bytes)).await
    }

    /// Whether the connection has ended (the server exited, or the hub closed it).
    pub fn is_closed(&self) -> bool {
        self.0.closed.is_cancelled()
    }
}

/// The result of an answer, read whole, or its error.
pub(crate) fn result_of(answer: &Message) -> Result<Value, RpcError> {
    if let Some(error) = answer.error() {
        return Err(RpcError::Server {
            code: raw::error_code(error).unwrap_or(0),
        });
    }
    answer
        .result()
        .and_then(|r| serde_json::from_slice(r).ok())
        .ok_or(RpcError::Malformed)
}

/// Where the progress of one of pi's requests goes: that request's stream, under pi's own token.
pub(crate) struct ProgressRoute {
    pub(crate) stream: mpsc::Sender<Bytes>,
    /// pi's token, as pi wrote it.
    pub(crate) token: Bytes,
}

struct Pending {
    answer: oneshot::Sender<Result<Message, RpcError>>,
    progress: Option<ProgressRoute>,
}

/// How a message reaches the server.
pub(crate) enum Wire {
    /// A stdio server's standard input (gone once closed).
    Stdio(tokio::sync::Mutex<Option<tokio::process::ChildStdin>>),
    Http(Box<HttpTransport>),
}

/// What a message sent is, for the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// A request, whose answer the wire waits for when it comes on the request's own response.
    Request(u64),
    /// The `initialize` request: over HTTP, its answer opens the session.
    Initialize(u64),
    /// A notification or an answer.
    Other,
}

/// One connection: how to send, the requests awaiting an answer, and pi's side.
pub(crate) struct Core {
    /// This connection itself, for the tasks it starts.
    me: Weak<Core>,
    wire: Wire,
    pending: Mutex<HashMap<u64, Pending>>,
    next_id: AtomicU64,
    events: UpstreamEvents,
    closed: CancellationToken,
    /// The server's requests of pi awaiting pi's answer, by the server's id: cancelled when the
    /// server cancels one.
    asked: Mutex<HashMap<Bytes, CancellationToken>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Removes a request from the pending ones when its caller gives up on it.
struct Forget<'a> {
    core: &'a Core,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(&self.core.pending).remove(&self.id);
    }
}

impl Core {
    pub(crate) fn new(wire: Wire, events: UpstreamEvents) -> Arc<Core> {
        Arc::new_cyclic(|me| Core {
            me: me.clone(),
            wire,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            events,
            closed: CancellationToken::new(),
            asked: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn http(&self) -> Option<&HttpTransport> {
        match &self.wire {
            Wire::Http(http) => Some(http),
            Wire::Stdio(_) => None,
        }
    }

    /// A fresh id for a request to the server.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends request `id` (`bytes`, carrying that id) and waits for its answer as the server wrote
    /// it; its progress goes to `progress` meanwhile. A dropped future forgets the request.
    pub(crate) async fn call(
        self: &Arc<Self>,
        id: u64,
        bytes: Bytes,
        progress: Option<ProgressRoute>,
    ) -> Result<Message, RpcError> {
        self.call_as(Sent::Request(id), id, bytes, progress).await
    }

    pub(crate) async fn call_as(
        self: &Arc<Self>,
        sent: Sent,
        id: u64,
        bytes: Bytes,
        progress: Option<ProgressRoute>,
    ) -> Result<Message, RpcError> {
        let (answer, answered) = oneshot::channel();
        lock(&self.pending).insert(id, Pending { answer, progress });
        let _forget = Forget { core: self, id };
        if self.closed.is_cancelled() {
            return Err(RpcError::Closed);
        }
        let mut answered = answered;
        {
            // Over HTTP, sending a request waits for its answer on the response's own stream,
            // resumed when it breaks; a server may answer on the session's stream instead (as one
            // resuming a request's stream there does), and that answer ends the wait.
            let sending = self.send_as(sent, bytes);
            tokio::pin!(sending);
            tokio::select! {
                biased;
                sent = &mut sending => sent?,
                answer = &mut answered => return answer.unwrap_or(Err(RpcError::Closed)),
            }
        }
        // A connection that closes answers every request waiting (`close`), this one included: it
        // was waiting before the close, or saw it above.
        answered.await.unwrap_or(Err(RpcError::Closed))
    }

    /// Sends a notification or an answer.
    pub(crate) async fn send(self: &Arc<Self>, bytes: Bytes) -> Result<(), RpcError> {
        self.send_as(Sent::Other, bytes).await
    }

    async fn send_as(self: &Arc<Self>, sent: Sent, bytes: Bytes) -> Result<(), RpcError> {
        match &self.wire {
            Wire::Stdio(stdin) => {
                let mut line = Vec::with_capacity(bytes.len() + 1);
                line.extend_from_slice(&bytes);
                line.push(b'\n');
                let mut stdin = stdin.lock().await;
                let Some(pipe) = stdin.as_mut() else {
                    return Err(RpcError::Closed);
                };
                pipe.write_all(&line).await.map_err(|_| RpcError::Closed)
            }
            Wire::Http(http) => {
                let (awaiting, initialize) = match sent {
                    Sent::Request(id) => (Some(id), false),
                    Sent::Initialize(id) => (Some(id), true),
                    Sent::Other => (None, false),
                };
                let inbound: Arc<dyn Inbound> = self.clone();
                http.post(&inbound, bytes, awaiting, initialize)
                    .await
                    .map_err(RpcError::from)
            }
        }
    }

    /// Closes a stdio server's standard input (the first step of its shutdown).
    pub(crate) async fn close_stdin(&self) {
        if let Wire::Stdio(stdin) = &self.wire {
            drop(stdin.lock().await.take());
        }
    }

    /// The connection has ended: every request waiting is answered with [`RpcError::Closed`].
    pub(crate) fn close(&self) {
        self.closed.cancel();
        let pending: Vec<Pending> = lock(&self.pending).drain().map(|(_, p)| p).collect();
        for p in pending {
            let _ = p.answer.send(Err(RpcError::Closed));
        }
    }

    /// Request `id` has failed where it was read (an answer over the size limit).
    pub(crate) fn fail(&self, id: u64, error: RpcError) {
        if let Some(p) = lock(&self.pending).remove(&id) {
            let _ = p.answer.send(Err(error));
        }
    }

    /// One message from the server, routed. Returns the id of the request it answered, if it
    /// answered one.
    pub(crate) fn receive(&self, bytes: Bytes) -> Option<u64> {
        self.route(Message::parse(bytes)?)
    }

    /// [`Core::receive`], for a message already read.
    pub(crate) fn route(&self, message: Message) -> Option<u64> {
        if message.is_answer() {
            let id = message.numeric_id()?;
            let pending = lock(&self.pending).remove(&id)?;
            let _ = pending.answer.send(Ok(message));
            return Some(id);
        }
        match message.method() {
            Some(_) if message.is_request() => self.asked_by_server(message),
            Some("notifications/progress") => self.progress(&message),
            Some("notifications/cancelled") => {
                let id = message.params().and_then(raw::cancelled_request);
                if let Some(ask) = id.and_then(|id| lock(&self.asked).get(&id).cloned()) {
                    ask.cancel();
                }
            }
            Some(_) => {
                if let Some(session) = self.events.attached() {
                    session.deliver(message.bytes().clone());
                }
            }
            None => {}
        }
        None
    }

    /// Progress on one of pi's requests: to its stream, under pi's token.
    fn progress(&self, message: &Message) {
        let (Some(params), Some(start)) = (message.params(), message.params_start()) else {
            return;
        };
        let Some(at) = raw::progress_token(params) else {
            return;
        };
        let token = &params[at.clone()];
        let Some(id) = std::str::from_utf8(token)
            .ok()
            .and_then(|t| t.parse::<u64>().ok())
        else {
            return;
        };
        let route = lock(&self.pending)
            .get(&id)
            .and_then(|p| p.progress.as_ref())
            .map(|r| (r.stream.clone(), r.token.clone()));
        let Some((stream, pi_token)) = route else {
            return;
        };
        let edit = raw::Edit::new(at, &pi_token).shifted(start);
        // A stalled pi loses the progress that does not fit, never the result.
        let _ = stream.try_send(message.edited(vec![edit]));
    }

    /// A request of the server's: a ping answered here, anything else asked of pi's attached
    /// session, whose answer goes back under the server's id.
    fn asked_by_server(&self, message: Message) {
        let (Some(id), Some(core)) = (message.id(), self.me.upgrade()) else {
            return;
        };
        if message.method() == Some("ping") {
            let answer = answer_bytes(&id, Ok(b"{}"));
            tokio::spawn(async move { core.send(answer).await });
            return;
        }
        let Some(session) = self.events.attached() else {
            let method = message.method().unwrap_or_default();
            let words = format!("no MCP client is attached to the hub to answer {method}");
            let refusal = error_bytes(&id, -32603, &words);
            tokio::spawn(async move { core.send(refusal).await });
            return;
        };
        // Put to pi now, in the order the server wrote its messages; answered from a task.
        let asked = session.ask(&message);
        let cancel = CancellationToken::new();
        lock(&self.asked).insert(id.clone(), cancel.clone());
        tokio::spawn(async move {
            let answer = asked.answer(&cancel).await;
            lock(&core.asked).remove(&id);
            let reply = match answer {
                Ok(answer) => answer.with_id(&id),
                // The server cancelled it: it wants no answer.
                Err(_) if cancel.is_cancelled() => return,
                Err(words) => error_bytes(&id, -32603, words),
            };
            let _ = core.send(reply).await;
        });
    }
}

impl Inbound for Core {
    fn route(&self, message: Message) -> Option<u64> {
        Core::route(self, message)
    }
}

impl From<HttpFault> for RpcError {
    fn from(fault: HttpFault) -> RpcError {
        match fault {
            HttpFault::Refused(refusal) => RpcError::Transport(refusal),
            HttpFault::Closed => RpcError::Closed,
        }
    }
}

/// Reads a stdio server's output to its end, routing each message; then the connection is closed.
pub(crate) async fn read_stdio<R: tokio::io::AsyncRead + Unpin>(
    core: Weak<Core>,
    mut lines: LineReader<R>,
    max_line: usize,
) {
    while let Some(line) = lines.next().await {
        let Some(core) = core.upgrade() else { return };
        match line {
            Line::Whole(bytes) if !bytes.is_empty() => {
                core.receive(bytes);
            }
            Line::Whole(_) => {}
            Line::TooLong { id } => {
                let id = id.and_then(|id| {
                    let text = std::str::from_utf8(&id).ok()?;
                    text.trim_matches('"').parse::<u64>().ok()
                });
                if let Some(id) = id {
                    core.fail(
                        id,
                        RpcError::Transport(Refusal::BodyTooLarge(max_line as u64)),
                    );
                }
            }
        }
    }
    if let Some(core) = core.upgrade() {
        core.close();
    }
}

/// A JSON-RPC answer to request `id`: its result (JSON text) or an error.
pub(crate) fn answer_bytes(id: &[u8], result: Result<&[u8], (i64, &str)>) -> Bytes {
    match result {
        Ok(result) => {
            let mut out = Vec::with_capacity(result.len() + id.len() + 32);
            out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
            out.extend_from_slice(id);
            out.extend_from_slice(b",\"result\":");
            out.extend_from_slice(result);
            out.push(b'}');
            Bytes::from(out)
        }
        Err((code, words)) => error_bytes(id, code, words),
    }
}

/// A JSON-RPC error answer to request `id` (JSON text).
pub(crate) fn error_bytes(id: &[u8], code: i64, message: &str) -> Bytes {
    let error = json!({"code": code, "message": message});
    let mut out = Vec::with_capacity(id.len() + message.len() + 64);
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id);
    out.extend_from_slice(b",\"error\":");
    out.extend_from_slice(error.to_string().as_bytes());
    out.push(b'}');
    Bytes::from(out)
}
