//! The server's side of one connection as the hub holds it: the client handler every connection is
//! made with ([`UpstreamEvents`]), which forwards the server's notifications and requests to pi's
//! session in the order they came, and routes a request's progress to the request it reports on.

// Logging, sampling, roots and resource subscriptions are deprecated in rmcp (SEP-2577) but are the
// protocol `2025-11-25` pi and the servers speak; the relay passes them through.
#![allow(deprecated)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientJsonRpcMessage, ClientResult, GetMeta, Implementation,
    JsonRpcMessage, JsonRpcNotification, NotificationMetaObject, ProgressToken, ProtocolVersion,
    RequestId, ServerJsonRpcMessage, ServerNotification, ServerRequest,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::transport::Transport;
use rmcp::{ErrorData as McpError, RoleClient, Service};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::raw::RawResults;
use crate::session::PiSession;

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
