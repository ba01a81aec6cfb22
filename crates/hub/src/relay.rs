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
//! Everything is carried through rmcp's typed model, which keeps only the fields it knows; a result
//! then leaves for pi as the server wrote it ([`crate::raw`] keeps it, [`crate::answers`] sends it).
//! The rest (the `initialize` answer, notifications, requests either way) is rmcp's reading.

// Logging, sampling, roots and resource subscriptions are deprecated in rmcp (SEP-2577) but are the
// protocol `2025-11-25` pi and the servers speak; the relay passes them through.
#![allow(deprecated)]

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use ::http::{Request, Response, StatusCode, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    CancelTaskRequest, CancelledNotification, CancelledNotificationParam, ClientCapabilities,
    ClientConfig, ClientJsonRpcMessage, ClientNotification, ClientRequest, ClientResult,
    CompleteRequest, CompleteRequestParams, CompleteResult, CustomNotification, CustomRequest,
    CustomResult, GetExtensions, GetMeta, GetPromptRequest, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, GetSkillRequest, GetSkillRequestParams, GetSkillResult,
    GetTaskParams, GetTaskRequest, GetTaskResult, Implementation, InitializeRequestParams,
    InitializeResult, JsonRpcMessage, JsonRpcNotification, ListPromptsRequest, ListPromptsResult,
    ListResourceTemplatesRequest, ListResourceTemplatesResult, ListResourcesRequest,
    ListResourcesResult, ListSkillsRequest, ListSkillsResult, ListToolsRequest, ListToolsResult,
    NotificationMetaObject, PaginatedRequestParams, PingRequest, ProgressNotification,
    ProgressNotificationParam, ProgressToken, ProtocolVersion, ReadResourceDirectoryRequest,
    ReadResourceDirectoryRequestParams, ReadResourceDirectoryResult, ReadResourceRequest,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, RequestId,
    RootsListChangedNotification, ServerConfig, ServerJsonRpcMessage, ServerNotification,
    ServerRequest, ServerResult, SetLevelRequest, SetLevelRequestParams, SubscribeRequest,
    SubscribeRequestParams, UnsubscribeRequest, UnsubscribeRequestParams, UpdateTaskParams,
    UpdateTaskRequest,
};
use rmcp::service::{
    NotificationContext, OriginatingRequestId, PeerRequestOptions, RequestContext, ServiceRole,
};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService, Transport};
use rmcp::{
    ErrorData as McpError, Peer, RoleClient, RoleServer, ServerHandler, Service, ServiceError,
};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::answers::{AnswerKey, Answers, RawSessions, answer_key, lock_answers};
use crate::connect::Upstream;
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
enum Outcome {
    Ok,
    Error,
    Refused,
}

#[derive(Debug, Default)]
struct ToolCalls(Mutex<BTreeMap<(String, String), ToolCallCount>>);

impl ToolCalls {
    fn record(&self, server: &str, tool: &str, outcome: Outcome, took: Duration, bytes: usize) {
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

/// Where a progress notification for a relayed request goes: the peer that asked, with its token.
struct ProgressRoute<R: ServiceRole> {
    peer: Peer<R>,
    token: ProgressToken,
}

impl<R: ServiceRole> Clone for ProgressRoute<R> {
    fn clone(&self) -> Self {
        ProgressRoute {
            peer: self.peer.clone(),
            token: self.token.clone(),
        }
    }
}

/// Progress routes by the token rmcp put on the relayed request. A tokio mutex, held while the
/// request is sent, so that a progress notification cannot overtake its route.
type ProgressRoutes<R> = tokio::sync::Mutex<HashMap<ProgressToken, ProgressRoute<R>>>;

/// One downstream (pi's) session, once initialized.
struct Session {
    peer: Peer<RoleServer>,
    /// pi's requests being relayed, oldest first.
    in_flight: Mutex<Vec<RequestId>>,
}

impl Session {
    fn latest_in_flight(&self) -> Option<RequestId> {
        let ids = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ids.last().cloned()
    }
}

/// Marks one of pi's requests in flight while it is relayed.
struct InFlight {
    session: Arc<Session>,
    id: RequestId,
}

impl InFlight {
    fn new(session: Arc<Session>, id: RequestId) -> InFlight {
        session
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(id.clone());
        InFlight { session, id }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut ids = self
            .session
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = ids.iter().rposition(|id| *id == self.id) {
            ids.remove(at);
        }
    }
}

struct Shared {
    capabilities: ClientCapabilities,
    /// pi's sessions, in the order they initialized.
    sessions: Mutex<Vec<Weak<Session>>>,
    /// Routes for the progress of requests relayed to the server, towards pi.
    to_downstream: ProgressRoutes<RoleServer>,
    /// Routes for the progress of the server's requests relayed to pi, back to the server.
    to_upstream: ProgressRoutes<RoleClient>,
    /// The server's notifications, in the order they arrived, to the task that forwards them.
    queue: Mutex<Option<mpsc::Sender<Forward>>>,
    /// The server's results as it sent them, where its transport reads them.
    raw: RawResults,
}

impl Shared {
    /// The most recently initialized session that is still open.
    fn attached(&self) -> Option<Arc<Session>> {
        let sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions
            .iter()
            .rev()
            .filter_map(Weak::upgrade)
            .find(|s| !s.peer.is_transport_closed())
    }

    /// Waits (bounded) until every notification the server sent before now has been forwarded.
    async fn flush(&self) {
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
            ServerNotification::ProgressNotification(mut progress) => {
                let route = self
                    .to_downstream
                    .lock()
                    .await
                    .get(&progress.params.progress_token)
                    .cloned();
                if let Some(route) = route {
                    progress.params.progress_token = route.token;
                    let notification = ServerNotification::ProgressNotification(progress);
                    let _ = route.peer.send_notification(notification).await;
                }
            }
            other => {
                if let Some(session) = self.attached() {
                    let _ = session.peer.send_notification(other).await;
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
                    let _ = self.queue.try_send(Forward::Notification(notification));
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
                to_downstream: tokio::sync::Mutex::new(HashMap::new()),
                to_upstream: tokio::sync::Mutex::new(HashMap::new()),
                queue: Mutex::new(None),
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
        Ordered { inner, queue }
    }

    /// Whether a downstream session is attached (initialized and still open).
    pub fn has_downstream(&self) -> bool {
        self.attached().is_some()
    }

    fn attach(&self, session: &Arc<Session>) {
        let mut sessions = self
            .shared
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        sessions.retain(|s| s.strong_count() > 0);
        sessions.push(Arc::downgrade(session));
    }

    fn attached(&self) -> Option<Arc<Session>> {
        self.shared.attached()
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
        let Some(session) = self.attached() else {
            return match request {
                ServerRequest::PingRequest(_) => Ok(ClientResult::empty(())),
                other => Err(McpError::internal_error(
                    format!(
                        "no MCP client is attached to the hub to answer {}",
                        server_request_method(&other)
                    ),
                    None,
                )),
            };
        };
        let server_token = context.meta.get_progress_token();
        if !context.meta.is_empty() {
            *request.get_meta_mut() = context.meta.clone();
        }
        // Ride the stream of pi's latest request in flight (the one the server is most likely
        // working on), or pi's standalone stream when none is.
        if let Some(origin) = session.latest_in_flight() {
            request
                .extensions_mut()
                .insert(OriginatingRequestId(origin));
        }
        let route = server_token.map(|token| ProgressRoute {
            peer: context.peer.clone(),
            token,
        });
        let shared = self.shared.clone();
        let ct = context.ct.clone();
        // Sent from a task of its own: this handler runs scoped with the server's request id, which
        // rmcp would otherwise attach to the request as the pi request it belongs to.
        let relayed = tokio::spawn(async move {
            relay_request(&session.peer, request, ct, route, &shared.to_upstream, None)
                .await
                .map(|(answer, _)| answer)
        });
        relayed
            .await
            .unwrap_or_else(|_| Err(McpError::internal_error("the relay failed", None)))
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

/// Sends `request` to `to` and waits for its answer; passes a cancellation on (`ct`), and routes the
/// request's progress to `progress` meanwhile. With `ordered`, the answer waits until the
/// notifications the server sent before it have been forwarded.
async fn relay_request<R, P>(
    to: &Peer<R>,
    request: R::Req,
    ct: CancellationToken,
    progress: Option<ProgressRoute<P>>,
    routes: &ProgressRoutes<P>,
    ordered: Option<&Shared>,
) -> Result<(R::PeerResp, RequestId), McpError>
where
    R: ServiceRole,
    P: ServiceRole,
{
    let mut map = routes.lock().await;
    let handle = to
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await
        .map_err(relay_error)?;
    let token = handle.progress_token.clone();
    if let Some(route) = progress {
        map.insert(token.clone(), route);
    }
    drop(map);
    let id = handle.id.clone();
    let handle_id = id.clone();
    let answer = tokio::select! {
        answer = handle.await_response() => answer.map_err(relay_error),
        () = ct.cancelled() => {
            let cancelled = CancelledNotification::new(CancelledNotificationParam::new(
                Some(id),
                Some("the request was cancelled".to_owned()),
            ));
            let _ = to.send_notification(cancelled.into()).await;
            Err(McpError::internal_error("the request was cancelled", None))
        }
    };
    if let Some(shared) = ordered {
        shared.flush().await;
    }
    routes.lock().await.remove(&token);
    answer.map(|answer| (answer, handle_id))
}

fn relay_error(e: ServiceError) -> McpError {
    match e {
        // The peer's own error passes through unchanged.
        ServiceError::McpError(e) => e,
        ServiceError::TransportClosed => McpError::internal_error("the connection is closed", None),
        ServiceError::Cancelled { .. } => {
            McpError::internal_error("the request was cancelled", None)
        }
        _ => McpError::internal_error("the request could not be relayed", None),
    }
}

fn unexpected() -> McpError {
    McpError::internal_error(
        "the server's answer does not have the shape its request expects",
        None,
    )
}

/// The result as the type its request expects. rmcp reads a result without knowing its request
/// (its result type is untagged), so it may have read it as another type of the same shape.
fn typed<T: serde::de::DeserializeOwned>(result: ServerResult) -> Result<T, McpError> {
    serde_json::to_value(result)
        .and_then(serde_json::from_value)
        .map_err(|_| unexpected())
}

/// One server as it is served.
struct Served {
    name: String,
    peer: Peer<RoleClient>,
    info: InitializeResult,
    /// Listed at connect and not withheld.
    allowed: HashSet<String>,
    withheld: Withheld,
    events: UpstreamEvents,
    calls: Arc<ToolCalls>,
    /// The server's own results waiting to be sent to pi (see [`RawSessions`]).
    answers: Answers,
}

/// One of pi's sessions with one server.
struct RelaySession {
    served: Arc<Served>,
    session: OnceLock<Arc<Session>>,
}

impl RelaySession {
    fn new(served: Arc<Served>) -> RelaySession {
        RelaySession {
            served,
            session: OnceLock::new(),
        }
    }

    fn answers(&self) -> MutexGuard<'_, HashMap<AnswerKey, Value>> {
        lock_answers(&self.served.answers)
    }

    async fn forward(
        &self,
        mut request: ClientRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<ServerResult, McpError> {
        let key = answer_key(&context);
        let pi_token = context.meta.get_progress_token();
        if !context.meta.is_empty() {
            *request.get_meta_mut() = context.meta.clone();
        }
        let _in_flight = self
            .session
            .get()
            .map(|s| InFlight::new(s.clone(), context.id.clone()));
        let route = pi_token.map(|token| ProgressRoute {
            peer: context.peer.clone(),
            token,
        });
        let (result, id) = relay_request(
            &self.served.peer,
            request,
            context.ct.clone(),
            route,
            &self.served.events.shared.to_downstream,
            Some(&self.served.events.shared),
        )
        .await?;
        let raw = self.served.events.raw().take(&id);
        if let (Some(key), Some(raw)) = (key, raw) {
            self.answers().insert(key, raw);
        }
        Ok(result)
    }

    async fn notify_upstream(
        &self,
        mut notification: ClientNotification,
        context: NotificationContext<RoleServer>,
    ) {
        restore_notification_meta(&mut notification, context.meta);
        let _ = self.served.peer.send_notification(notification).await;
    }

    async fn call(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let served = &self.served;
        let tool = params.name.to_string();
        let refuse = |message: String| {
            served
                .calls
                .record(&served.name, &tool, Outcome::Refused, Duration::ZERO, 0);
            Err(McpError::invalid_params(message, None))
        };
        if served.withheld.contains(&tool) {
            return refuse(format!("tool {tool} is withheld from this job"));
        }
        if !served.allowed.contains(&tool) {
            return refuse(format!("unknown tool {tool}: the server did not list it"));
        }
        let started = Instant::now();
        let key = answer_key(&context);
        let answer = self
            .forward(
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                context,
            )
            .await;
        let took = started.elapsed();
        let answer = answer.and_then(|result| {
            // What pi gets: the server's own result when it was seen, else rmcp's reading of it.
            let answers = self.answers();
            let (bytes, raw_error) = match key.as_ref().and_then(|k| answers.get(k)) {
                Some(raw) => (
                    serde_json::to_vec(raw).map_or(0, |b| b.len()),
                    Some(raw.get("isError") == Some(&Value::Bool(true))),
                ),
                None => (serde_json::to_vec(&result).map_or(0, |b| b.len()), None),
            };
            drop(answers);
            call_tool_response(result).map(|r| (r, bytes, raw_error))
        });
        match answer {
            Ok((response, bytes, raw_error)) => {
                let failed = raw_error.unwrap_or(
                    matches!(&response, CallToolResponse::Complete(r) if r.is_error == Some(true)),
                );
                let outcome = if failed { Outcome::Error } else { Outcome::Ok };
                served
                    .calls
                    .record(&served.name, &tool, outcome, took, bytes);
                Ok(response)
            }
            Err(e) => {
                served
                    .calls
                    .record(&served.name, &tool, Outcome::Error, took, 0);
                Err(e)
            }
        }
    }
}

fn call_tool_response(result: ServerResult) -> Result<CallToolResponse, McpError> {
    Ok(match result {
        ServerResult::CallToolResult(r) => CallToolResponse::Complete(r),
        ServerResult::InputRequiredResult(r) => CallToolResponse::InputRequired(r),
        ServerResult::CreateTaskResult(r) => CallToolResponse::Task(r),
        other => CallToolResponse::Complete(typed::<CallToolResult>(other)?),
    })
}

impl ServerHandler for RelaySession {
    fn get_info(&self) -> ServerConfig {
        self.served.info.clone()
    }

    /// Up to the version the server agreed with the relay: pi gets no newer protocol than the
    /// server speaks.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(
            &self.served.info.protocol_version,
        ))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        let session = Arc::new(Session {
            peer: context.peer.clone(),
            in_flight: Mutex::new(Vec::new()),
        });
        self.served.events.attach(&session);
        let _ = self.session.set(session);
        self.negotiate_initialize(&request)
    }

    async fn ping(&self, context: RequestContext<RoleServer>) -> Result<(), McpError> {
        let ping = PingRequest {
            method: Default::default(),
            extensions: Default::default(),
        };
        self.forward(ClientRequest::PingRequest(ping), context)
            .await
            .map(drop)
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let request = ClientRequest::CompleteRequest(CompleteRequest::new(request));
        match self.forward(request, context).await? {
            ServerResult::CompleteResult(r) => Ok(r),
            other => typed(other),
        }
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let request = ClientRequest::SetLevelRequest(SetLevelRequest::new(request));
        self.forward(request, context).await.map(drop)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(request));
        Ok(match self.forward(request, context).await? {
            ServerResult::GetPromptResult(r) => GetPromptResponse::Complete(r),
            ServerResult::InputRequiredResult(r) => GetPromptResponse::InputRequired(r),
            other => GetPromptResponse::Complete(typed::<GetPromptResult>(other)?),
        })
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let request = ClientRequest::ListPromptsRequest(ListPromptsRequest {
            method: Default::default(),
            params: request,
            extensions: Default::default(),
        });
        match self.forward(request, context).await? {
            ServerResult::ListPromptsResult(r) => Ok(r),
            other => typed(other),
        }
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let request = ClientRequest::ListResourcesRequest(ListResourcesRequest {
            method: Default::default(),
            params: request,
            extensions: Default::default(),
        });
        match self.forward(request, context).await? {
            ServerResult::ListResourcesResult(r) => Ok(r),
            other => typed(other),
        }
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let request = ClientRequest::ListResourceTemplatesRequest(ListResourceTemplatesRequest {
            method: Default::default(),
            params: request,
            extensions: Default::default(),
        });
        match self.forward(request, context).await? {
            ServerResult::ListResourceTemplatesResult(r) => Ok(r),
            other => typed(other),
        }
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let request = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(request));
        Ok(match self.forward(request, context).await? {
            ServerResult::ReadResourceResult(r) => ReadResourceResponse::Complete(r),
            ServerResult::InputRequiredResult(r) => ReadResourceResponse::InputRequired(r),
            other => ReadResourceResponse::Complete(typed::<ReadResourceResult>(other)?),
        })
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let request = ClientRequest::SubscribeRequest(SubscribeRequest::new(request));
        self.forward(request, context).await.map(drop)
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let request = ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(request));
        self.forward(request, context).await.map(drop)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.call(request, context).await
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let request = ClientRequest::ListToolsRequest(ListToolsRequest {
            method: Default::default(),
            params: request,
            extensions: Default::default(),
        });
        let key = answer_key(&context);
        let mut result: ListToolsResult = match self.forward(request, context).await? {
            ServerResult::ListToolsResult(r) => r,
            other => typed(other)?,
        };
        let allowed = &self.served.allowed;
        result
            .tools
            .retain(|tool| allowed.contains(tool.name.as_ref()));
        let mut answers = self.answers();
        if let Some(Value::Array(tools)) = key
            .and_then(|k| answers.get_mut(&k))
            .and_then(|raw| raw.get_mut("tools"))
        {
            tools.retain(|tool| {
                tool.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|name| allowed.contains(name))
            });
        }
        Ok(result)
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        let result = self
            .forward(ClientRequest::CustomRequest(request), context)
            .await?;
        serde_json::to_value(result)
            .map(CustomResult)
            .map_err(|_| unexpected())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let request = ClientRequest::GetTaskRequest(GetTaskRequest::new(request));
        match self.forward(request, context).await? {
            ServerResult::GetTaskResult(r) => Ok(r),
            other => typed(other),
        }
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let request = ClientRequest::UpdateTaskRequest(UpdateTaskRequest::new(request));
        self.forward(request, context).await.map(drop)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let request = ClientRequest::CancelTaskRequest(CancelTaskRequest::new(request));
        self.forward(request, context).await.map(drop)
    }

    async fn list_skills(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListSkillsResult, McpError> {
        let request = ClientRequest::ListSkillsRequest(ListSkillsRequest {
            method: Default::default(),
            params: request,
            extensions: Default::default(),
        });
        match self.forward(request, context).await? {
            ServerResult::ListSkillsResult(r) => Ok(r),
            other => typed(other),
        }
    }

    async fn get_skill(
        &self,
        request: GetSkillRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetSkillResult, McpError> {
        let request = ClientRequest::GetSkillRequest(GetSkillRequest::new(request));
        match self.forward(request, context).await? {
            ServerResult::GetSkillResult(r) => Ok(r),
            other => typed(other),
        }
    }

    async fn read_resource_directory(
        &self,
        request: ReadResourceDirectoryRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceDirectoryResult, McpError> {
        let request =
            ClientRequest::ReadResourceDirectoryRequest(ReadResourceDirectoryRequest::new(request));
        let result = self.forward(request, context).await?;
        typed(result)
    }

    async fn on_progress(
        &self,
        mut notification: ProgressNotificationParam,
        context: NotificationContext<RoleServer>,
    ) {
        // pi's progress on a request the server made of it: back to the server, with its token.
        let route = self
            .served
            .events
            .shared
            .to_upstream
            .lock()
            .await
            .get(&notification.progress_token)
            .cloned();
        if let Some(route) = route {
            notification.progress_token = route.token;
            let mut progress =
                ClientNotification::ProgressNotification(ProgressNotification::new(notification));
            restore_notification_meta(&mut progress, context.meta);
            let _ = route.peer.send_notification(progress).await;
        }
    }

    async fn on_roots_list_changed(&self, context: NotificationContext<RoleServer>) {
        let changed = RootsListChangedNotification {
            method: Default::default(),
            extensions: Default::default(),
        };
        self.notify_upstream(
            ClientNotification::RootsListChangedNotification(changed),
            context,
        )
        .await;
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        context: NotificationContext<RoleServer>,
    ) {
        self.notify_upstream(
            ClientNotification::CustomNotification(notification),
            context,
        )
        .await;
    }

    // `notifications/cancelled` from pi: rmcp has already cancelled the relayed request (its
    // context token), which cancels it upstream with the server's own request id.
    // `notifications/initialized` from pi: the relay's own handshake; the server had the relay's.
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
        let served = Arc::new(Served {
            name: name.clone(),
            peer: upstream.peer.clone(),
            info: upstream.info().clone(),
            allowed,
            withheld,
            events: upstream.events().clone(),
            calls: calls.clone(),
            answers: Answers::default(),
        });
        let mut local = LocalSessionManager::default();
        // pi may leave a server idle for the whole job: its session lasts until the hub stops.
        local.session_config.keep_alive = None;
        let sessions = RawSessions {
            local,
            answers: served.answers.clone(),
        };
        let config =
            StreamableHttpServerConfig::default().with_cancellation_token(ct.child_token());
        let service = StreamableHttpService::new(
            move || Ok(RelaySession::new(served.clone())),
            Arc::new(sessions),
            config,
        );
        routes.insert(name, service);
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

type HttpBody = BoxBody<Bytes, Infallible>;

struct Router {
    routes: HashMap<String, StreamableHttpService<RelaySession, RawSessions>>,
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
