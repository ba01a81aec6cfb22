//! The relay: each connected server served to pi over streamable HTTP, on one loopback listener at
//! `/mcp/<name>`, behind a bearer token. Everything passes through as it is, both ways — requests
//! (their `_meta` and progress tokens kept, a cancellation passed on), results, errors,
//! notifications, and the server's own requests of the client (sampling, roots, elicitation, ping) —
//! except that:
//!
//! - `initialize` is answered by the relay, with the server's own answer at connect (capabilities,
//!   instructions, serverInfo), at a protocol version both sides speak;
//! - `tools/list` shows only the tools the server listed at connect and the job does not withhold;
//! - `tools/call` to a withheld tool, or to one the server did not list at connect, is refused
//!   before it reaches the server.
//!
//! All sessions of one server share its one upstream connection. The server's notifications go to
//! the most recently initialized session still open, and so do its requests of the client: pi opens
//! one session per server, so the latest is the live one (a reconnect replaces the old one). A
//! progress notification goes instead to the session whose request it reports on, with that
//! request's own token.
//!
//! The server's side is rmcp's client, whose typed model keeps only the fields it knows; a result
//! still leaves for pi as the server wrote it ([`crate::raw`] keeps it). pi's side is the hub's own
//! streamable-HTTP endpoint ([`crate::endpoint`]). What is rmcp's reading: the `initialize` answer,
//! the server's notifications and requests, pi's requests (parsed to be sent on).

// Logging, sampling, roots and resource subscriptions are deprecated in rmcp (SEP-2577) but are the
// protocol `2025-11-25` pi and the servers speak; the relay passes them through.
#![allow(deprecated)]

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use ::http::{Request, Response, StatusCode, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientJsonRpcMessage, ClientResult, GetMeta, Implementation,
    JsonRpcMessage, JsonRpcNotification, NotificationMetaObject, ProgressToken, ProtocolVersion,
    RequestId, ServerJsonRpcMessage, ServerNotification, ServerRequest,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::transport::Transport;
use rmcp::{ErrorData as McpError, RoleClient, Service};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::connect::Upstream;
use crate::endpoint::{Endpoint, HttpBody, PiSession, Served};
use crate::raw::RawResults;

/// The GitHub forge server's tools the job withholds (merging, approving, starting Copilot).
pub const GITHUB_WITHHELD: [&str; 4] = [
    "merge_pull_request",
    "pull_request_review_write",
    "assign_copilot_to_issue",
    "request_copilot_review",
];

/// The GitLab forge server's tools the job withholds (merging, approving, more toolsets, GraphQL).
pub const GITLAB_WITHHELD: [&str; 6] = [
    "merge_merge_request",
    "approve_merge_request",
    "unapprove_merge_request",
    "approve_deployment",
    "discover_tools",
    "execute_graphql",
];

/// Tools of one server left out of every tool list and refused on every call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Withheld(pub Vec<String>);

impl Withheld {
    /// Nothing withheld (every overlay server).
    pub fn none() -> Withheld {
        Withheld(Vec::new())
    }

    pub fn new<I, S>(names: I) -> Withheld
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Withheld(names.into_iter().map(Into::into).collect())
    }

    /// What the job withholds from GitHub's forge server.
    pub fn github() -> Withheld {
        Withheld::new(GITHUB_WITHHELD)
    }

    /// What the job withholds from GitLab's forge server.
    pub fn gitlab() -> Withheld {
        Withheld::new(GITLAB_WITHHELD)
    }

    pub fn contains(&self, tool: &str) -> bool {
        self.0.iter().any(|t| t == tool)
    }
}

/// How the tool calls to one tool of one server went: counts, time and result size, never the
/// arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolCallCount {
    pub server: String,
    pub tool: String,
    /// Every call pi made, refused ones included.
    pub calls: u64,
    /// Answered with a result that is not an error.
    pub ok: u64,
    /// Answered with an error result (`isError`) or a JSON-RPC error, or cut short.
    pub error: u64,
    /// Refused before reaching the server: withheld, or not listed at connect.
    pub refused: u64,
    /// Time spent on the calls that reached the server, in milliseconds.
    pub total_ms: u64,
    /// Bytes of the results, as JSON.
    pub result_bytes: u64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    Ok,
    Error,
    Refused,
}

#[derive(Debug, Default)]
pub(crate) struct ToolCalls(Mutex<BTreeMap<(String, String), ToolCallCount>>);

impl ToolCalls {
    pub(crate) fn record(
        &self,
        server: &str,
        tool: &str,
        outcome: Outcome,
        took: Duration,
        bytes: usize,
    ) {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let count = all
            .entry((server.to_owned(), tool.to_owned()))
            .or_insert_with(|| ToolCallCount {
                server: server.to_owned(),
                tool: tool.to_owned(),
                ..ToolCallCount::default()
            });
        count.calls += 1;
        match outcome {
            Outcome::Ok => count.ok += 1,
            Outcome::Error => count.error += 1,
            Outcome::Refused => count.refused += 1,
        }
        count.total_ms += u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        count.result_bytes += u64::try_from(bytes).unwrap_or(u64::MAX);
    }

    fn snapshot(&self) -> Vec<ToolCallCount> {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.values().cloned().collect()
    }
}

/// Where the progress of one of pi's requests goes: that request's stream, under pi's own token.
pub(crate) struct ProgressRoute {
    pub(crate) stream: mpsc::Sender<Value>,
    pub(crate) token: Value,
}

pub(crate) struct Shared {
    capabilities: ClientCapabilities,
    /// pi's sessions, in the order they initialized.
    sessions: Mutex<Vec<Weak<PiSession>>>,
    /// Routes for the progress of requests relayed to the server, by the token rmcp put on the
    /// relayed request. A Tokio mutex, held while the request is sent, so that a progress
    /// notification cannot overtake its route.
    pub(crate) progress: tokio::sync::Mutex<HashMap<ProgressToken, ProgressRoute>>,
    /// The server's notifications, in the order they arrived, to the task that forwards them.
    queue: Mutex<Option<mpsc::Sender<Forward>>>,
    /// How many of the server's notifications are queued or being forwarded.
    pending: Arc<AtomicUsize>,
    /// The server's results as it sent them, where its transport reads them.
    raw: RawResults,
}

impl Shared {
    /// The most recently initialized session that is still open.
    fn attached(&self) -> Option<Arc<PiSession>> {
        let sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions
            .iter()
            .rev()
            .filter_map(Weak::upgrade)
            .find(|s| !s.ended.is_cancelled())
    }

    /// Waits (bounded) until every notification the server sent before now has been forwarded.
    pub(crate) async fn flush(&self) {
        // Nothing queued (the usual case): nothing to wait for.
        if self.pending.load(AtomicOrdering::Acquire) == 0 {
            return;
        }
        let queue = self
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(queue) = queue else { return };
        let (done, flushed) = oneshot::channel();
        let _ = tokio::time::timeout(FORWARD_BOUND, async move {
            if queue.send(Forward::Flush(done)).await.is_ok() {
                let _ = flushed.await;
            }
        })
        .await;
    }

    /// Forwards one of the server's notifications: progress to the session whose request it
    /// reports on, under that request's own token; the rest to the attached session.
    async fn forward(&self, notification: ServerNotification) {
        match notification {
            // The server cancels a request it made of the client: rmcp cancels the relayed request
            // (its context token), which tells pi with pi's own request id.
            ServerNotification::CancelledNotification(_) => {}
            ServerNotification::ProgressNotification(progress) => {
                let routes = self.progress.lock().await;
                let Some(route) = routes.get(&progress.params.progress_token) else {
                    return;
                };
                let notification = ServerJsonRpcMessage::notification(
                    ServerNotification::ProgressNotification(progress),
                );
                if let Ok(mut message) = serde_json::to_value(notification) {
                    message["params"]["progressToken"] = route.token.clone();
                    let _ = route.stream.try_send(message);
                }
            }
            other => {
                let Some(session) = self.attached() else {
                    return;
                };
                if let Ok(message) = serde_json::to_value(ServerJsonRpcMessage::notification(other))
                {
                    session.deliver(message);
                }
            }
        }
    }
}

/// How long one forwarded notification, or a wait for them, may take before the relay goes on.
const FORWARD_BOUND: Duration = Duration::from_secs(5);

/// How many of a server's notifications may wait to be forwarded.
const FORWARD_QUEUE: usize = 1024;

enum Forward {
    Notification(ServerNotification),
    Flush(oneshot::Sender<()>),
}

/// Forwards the server's notifications one at a time, in the order they arrived. Ends with the
/// connection (the last sender goes with its transport and `Shared`).
async fn forward_in_order(shared: Weak<Shared>, mut queue: mpsc::Receiver<Forward>) {
    while let Some(item) = queue.recv().await {
        match item {
            Forward::Flush(done) => {
                let _ = done.send(());
            }
            Forward::Notification(notification) => {
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                let _ = tokio::time::timeout(FORWARD_BOUND, shared.forward(notification)).await;
                shared.pending.fetch_sub(1, AtomicOrdering::Release);
            }
        }
    }
}

/// The transport to a server, as the relay reads it: the server's notifications (all but
/// `notifications/cancelled`, which rmcp needs) are taken off as they arrive and forwarded in that
/// order, instead of each in a task of its own as rmcp would; a result is handed on only after the
/// notifications before it were queued, so that a request's last progress precedes its result.
pub(crate) struct Ordered<T> {
    inner: T,
    queue: mpsc::Sender<Forward>,
    pending: Arc<AtomicUsize>,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Ordered<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        loop {
            let message = self.inner.receive().await?;
            match message {
                JsonRpcMessage::Notification(JsonRpcNotification { notification, .. })
                    if !matches!(notification, ServerNotification::CancelledNotification(_)) =>
                {
                    // Nothing awaits between taking the message and queueing it: cancel-safe as
                    // the inner transport is. A server that floods a stalled client loses the
                    // notifications that do not fit.
                    self.pending.fetch_add(1, AtomicOrdering::AcqRel);
                    if self
                        .queue
                        .try_send(Forward::Notification(notification))
                        .is_err()
                    {
                        self.pending.fetch_sub(1, AtomicOrdering::Release);
                    }
                }
                other => return Some(other),
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// The client side of one server's connection: the handler the connection is made with. Every
/// notification the server sends goes to pi's session (see the module's notes), and every request
/// it makes of the client is relayed to that session, or answered with an error while none is
/// attached (a ping is answered by the relay then).
#[derive(Clone)]
pub struct UpstreamEvents {
    shared: Arc<Shared>,
}

impl Default for UpstreamEvents {
    fn default() -> Self {
        UpstreamEvents::new()
    }
}

impl std::fmt::Debug for UpstreamEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamEvents")
            .field("capabilities", &self.shared.capabilities)
            .finish_non_exhaustive()
    }
}

impl UpstreamEvents {
    /// A client that declares no capability: the server will not ask for sampling, roots or
    /// elicitation, which pi may not offer (pi's own capabilities are not known at connect).
    pub fn new() -> UpstreamEvents {
        UpstreamEvents::with_capabilities(ClientCapabilities::default())
    }

    /// A client that declares `capabilities` to the server; the requests they invite are relayed to
    /// pi, which answers them or refuses.
    pub fn with_capabilities(capabilities: ClientCapabilities) -> UpstreamEvents {
        UpstreamEvents::with_raw(capabilities, RawResults::default())
    }

    /// A client that declares no capability, for a connection whose transport keeps its results
    /// in `raw` as the server sent them (the HTTP transport's [`crate::http::Upstream::raw`]): the
    /// relay hands pi those rather than rmcp's reading of them. A stdio connection needs no
    /// such thing: [`crate::connect::connect_stdio`] reads the server's output itself.
    pub fn reading(raw: RawResults) -> UpstreamEvents {
        UpstreamEvents::with_raw(ClientCapabilities::default(), raw)
    }

    fn with_raw(capabilities: ClientCapabilities, raw: RawResults) -> UpstreamEvents {
        UpstreamEvents {
            shared: Arc::new(Shared {
                capabilities,
                sessions: Mutex::new(Vec::new()),
                progress: tokio::sync::Mutex::new(HashMap::new()),
                queue: Mutex::new(None),
                pending: Arc::new(AtomicUsize::new(0)),
                raw,
            }),
        }
    }

    /// Where the connection's transport keeps the server's results as it sent them.
    pub(crate) fn raw(&self) -> &RawResults {
        &self.shared.raw
    }

    /// Wraps the transport of the connection made with these events (one connection per
    /// `UpstreamEvents`), and starts the task that forwards its notifications in order.
    pub(crate) fn ordered<T: Transport<RoleClient>>(&self, inner: T) -> Ordered<T> {
        let (queue, forwarded) = mpsc::channel(FORWARD_QUEUE);
        *self
            .shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(queue.clone());
        tokio::spawn(forward_in_order(Arc::downgrade(&self.shared), forwarded));
        Ordered {
            inner,
            queue,
            pending: self.shared.pending.clone(),
        }
    }

    /// Whether a downstream session is attached (initialized and still open).
    pub fn has_downstream(&self) -> bool {
        self.attached().is_some()
    }

    pub(crate) fn attach(&self, session: &Arc<PiSession>) {
        let mut sessions = self
            .shared
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        sessions.retain(|s| s.strong_count() > 0);
        sessions.push(Arc::downgrade(session));
    }

    fn attached(&self) -> Option<Arc<PiSession>> {
        self.shared.attached()
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }
}

/// The protocol version the relay announces to a server.
pub const CLIENT_PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// The client name the relay announces to a server.
pub const CLIENT_NAME: &str = "pi-dispatch-hub";

impl Service<RoleClient> for UpstreamEvents {
    async fn handle_request(
        &self,
        mut request: ServerRequest,
        context: RequestContext<RoleClient>,
    ) -> Result<ClientResult, McpError> {
        // A ping asks whether the connection is alive, which the hub answers for itself.
        if matches!(request, ServerRequest::PingRequest(_)) {
            return Ok(ClientResult::empty(()));
        }
        let Some(session) = self.attached() else {
            return Err(McpError::internal_error(
                format!(
                    "no MCP client is attached to the hub to answer {}",
                    server_request_method(&request)
                ),
                None,
            ));
        };
        // With the server's own `_meta` (its progress token included: pi's progress on the
        // request goes back to the server unchanged).
        if !context.meta.is_empty() {
            *request.get_meta_mut() = context.meta.clone();
        }
        let message = ServerJsonRpcMessage::request(request, RequestId::Number(0));
        let message = serde_json::to_value(message)
            .map_err(|_| McpError::internal_error("the request cannot be relayed", None))?;
        let answer = session.ask(message, &context.ct).await?;
        if let Some(error) = answer.get("error") {
            return Err(
                serde_json::from_value::<McpError>(error.clone()).unwrap_or_else(|_| {
                    McpError::internal_error("pi answered with an unreadable error", None)
                }),
            );
        }
        let result = answer.get("result").cloned().unwrap_or(Value::Null);
        serde_json::from_value::<ClientResult>(result).map_err(|_| {
            McpError::internal_error("pi's answer does not have the shape of a result", None)
        })
    }

    async fn handle_notification(
        &self,
        mut notification: ServerNotification,
        context: NotificationContext<RoleClient>,
    ) -> Result<(), McpError> {
        // Through [`Ordered`], only `notifications/cancelled` comes here; a connection made
        // without it has each notification forwarded from a task of its own, in no set order.
        restore_notification_meta(&mut notification, context.meta);
        self.shared.forward(notification).await;
        Ok(())
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            self.shared.capabilities.clone(),
            Implementation::new(CLIENT_NAME, env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(CLIENT_PROTOCOL_VERSION)
    }
}

fn server_request_method(request: &ServerRequest) -> &str {
    match request {
        ServerRequest::PingRequest(_) => "ping",
        ServerRequest::CreateMessageRequest(_) => "sampling/createMessage",
        ServerRequest::ListRootsRequest(_) => "roots/list",
        ServerRequest::ElicitRequest(_) => "elicitation/create",
        ServerRequest::CustomRequest(r) => r.method.as_str(),
        _ => "the request",
    }
}

fn restore_notification_meta<N>(notification: &mut N, meta: NotificationMetaObject)
where
    N: GetMeta<Metadata = NotificationMetaObject>,
{
    if !meta.is_empty() {
        *notification.get_meta_mut() = meta;
    }
}

/// Why the hub did not start. The upstreams it was given are dropped, which kills the stdio ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    #[error("the hub's token is empty")]
    EmptyToken,
    #[error("server name {0:?} cannot be a path segment of the hub")]
    BadName(String),
    #[error("server {0} is given twice")]
    DuplicateName(String),
    #[error("the hub cannot listen on 127.0.0.1 ({0})")]
    Bind(String),
}

/// The running hub: one loopback listener, each server at `/mcp/<name>`.
pub struct Hub {
    addr: SocketAddr,
    ct: CancellationToken,
    accept: Option<JoinHandle<()>>,
    upstreams: Vec<Upstream>,
    calls: Arc<ToolCalls>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("addr", &self.addr)
            .field("upstreams", &self.upstreams)
            .finish_non_exhaustive()
    }
}

impl Hub {
    /// The address the hub listens on (127.0.0.1, a port of its own).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where pi reaches server `name`.
    pub fn url(&self, name: &str) -> String {
        format!("http://{}/mcp/{name}", self.addr)
    }

    /// The servers the hub serves.
    pub fn upstreams(&self) -> &[Upstream] {
        &self.upstreams
    }

    /// Every tool called so far, by server and tool.
    pub fn tool_calls(&self) -> Vec<ToolCallCount> {
        self.calls.snapshot()
    }

    /// Stops listening, ends pi's sessions, then shuts every server down (its process group killed).
    pub async fn shutdown(mut self) {
        self.ct.cancel();
        if let Some(accept) = self.accept.take() {
            let abort = accept.abort_handle();
            if tokio::time::timeout(Duration::from_secs(3), accept)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        let mut shutdowns = JoinSet::new();
        for upstream in self.upstreams.drain(..) {
            shutdowns.spawn(upstream.shutdown());
        }
        while shutdowns.join_next().await.is_some() {}
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.ct.cancel();
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
        // The upstreams drop with the hub: their process groups are killed.
    }
}

/// Serves `upstreams` to pi: one listener on 127.0.0.1 (a port of its own), each server at
/// `/mcp/<name>` over streamable HTTP, every request without `Authorization: Bearer <token>`
/// refused with 401.
pub async fn serve(upstreams: Vec<(Upstream, Withheld)>, token: String) -> Result<Hub, ServeError> {
    if token.is_empty() {
        return Err(ServeError::EmptyToken);
    }
    let calls = Arc::new(ToolCalls::default());
    let ct = CancellationToken::new();
    let mut routes = HashMap::new();
    let mut kept = Vec::new();
    for (upstream, withheld) in upstreams {
        let name = upstream.name.clone();
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            || name == "."
            || name == ".."
        {
            return Err(ServeError::BadName(name));
        }
        if routes.contains_key(&name) {
            return Err(ServeError::DuplicateName(name));
        }
        let allowed = upstream
            .tools
            .iter()
            .map(|t| t.name.to_string())
            .filter(|t| !withheld.contains(t))
            .collect();
        let served = Served {
            name: name.clone(),
            peer: upstream.peer.clone(),
            info: upstream.info().clone(),
            raw_info: upstream.raw_info().cloned(),
            allowed,
            withheld,
            events: upstream.events().clone(),
            calls: calls.clone(),
        };
        // pi may leave a server idle for the whole job: its sessions last until the hub stops.
        routes.insert(name, Endpoint::new(served, ct.child_token()));
        kept.push(upstream);
    }
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .map_err(|e| ServeError::Bind(e.kind().to_string()))?;
    let addr = listener
        .local_addr()
        .map_err(|e| ServeError::Bind(e.kind().to_string()))?;
    let router = Arc::new(Router {
        routes,
        expected: Sha256::digest(format!("Bearer {token}").as_bytes()).to_vec(),
    });
    let accept = tokio::spawn(accept_loop(listener, router, ct.clone()));
    Ok(Hub {
        addr,
        ct,
        accept: Some(accept),
        upstreams: kept,
        calls,
    })
}

struct Router {
    routes: HashMap<String, Endpoint>,
    /// SHA-256 of the one `Authorization` value accepted.
    expected: Vec<u8>,
}

impl Router {
    fn authorized(&self, request: &Request<Incoming>) -> bool {
        let Some(given) = request.headers().get(header::AUTHORIZATION) else {
            return false;
        };
        // Digests compared in full, whatever differs: the time does not tell how much matched.
        let given = Sha256::digest(given.as_bytes());
        given.len() == self.expected.len()
            && given
                .iter()
                .zip(&self.expected)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<HttpBody> {
        // A page in a browser that reaches the loopback address under a name of its own (DNS
        // rebinding) is turned away before anything else.
        if !loopback_host(&request) {
            return plain(
                StatusCode::FORBIDDEN,
                "Forbidden: the Host or Origin is not loopback",
            );
        }
        if !self.authorized(&request) {
            return plain(StatusCode::UNAUTHORIZED, "Unauthorized");
        }
        let route = request
            .uri()
            .path()
            .strip_prefix("/mcp/")
            .and_then(|name| self.routes.get(name));
        match route {
            Some(service) => service.handle(request).await,
            None => plain(StatusCode::NOT_FOUND, "Not Found"),
        }
    }
}

/// Whether the request's `Host` (required) and `Origin` (when sent) name this machine's loopback.
fn loopback_host(request: &Request<Incoming>) -> bool {
    let is_loopback = |host: &str| {
        let host = host.to_ascii_lowercase();
        matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]" | "::1")
    };
    let Some(host) = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    if !is_loopback(name) {
        return false;
    }
    match request.headers().get(header::ORIGIN) {
        None => true,
        Some(origin) => origin
            .to_str()
            .ok()
            .and_then(|o| reqwest::Url::parse(o).ok())
            .and_then(|url| url.host_str().map(is_loopback))
            .unwrap_or(false),
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<HttpBody> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *response.status_mut() = status;
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

async fn accept_loop(listener: TcpListener, router: Arc<Router>, ct: CancellationToken) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = ct.cancelled() => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                connections.spawn(serve_connection(stream, router.clone(), ct.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // Sessions end with the token; what is still open after a grace period is cut.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.shutdown().await;
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    router: Arc<Router>,
    ct: CancellationToken,
) {
    // An answer goes out in several writes: without this, each later write waits for a delayed
    // acknowledgement, some 40 ms per call.
    let _ = stream.set_nodelay(true);
    let service = hyper::service::service_fn(move |request| {
        let router = router.clone();
        async move { Ok::<_, Infallible>(router.handle(request).await) }
    });
    let connection =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        () = ct.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(1), connection).await;
        }
    }
}
