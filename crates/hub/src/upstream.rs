//! pi's side of one server's connection, as the connection sees it ([`UpstreamEvents`]): what the
//! hub declares to the server about the client, and pi's sessions, to which the server's
//! notifications and requests go.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use serde_json::Value;

use crate::session::PiSession;

/// The protocol version the hub announces to a server.
pub const CLIENT_PROTOCOL_VERSION: &str = "2025-11-25";

/// The client name the hub announces to a server.
pub const CLIENT_NAME: &str = "pi-dispatch-hub";

/// The client side of one server's connection, as the connection is made with it: the client
/// capabilities declared to the server, and pi's sessions. The server's notifications and requests
/// go to the most recently initialized session still open; while none is, a request of the
/// server's is answered with an error (a ping is answered by the hub all the same).
#[derive(Clone)]
pub struct UpstreamEvents {
    shared: Arc<Shared>,
}

struct Shared {
    capabilities: Value,
    /// pi's sessions, in the order they initialized.
    sessions: Mutex<Vec<Weak<PiSession>>>,
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
        UpstreamEvents::with_capabilities(Value::Object(serde_json::Map::new()))
    }

    /// A client that declares `capabilities` (an `initialize` request's `capabilities` object) to
    /// the server; the requests they invite are relayed to pi, which answers them or refuses.
    pub fn with_capabilities(capabilities: Value) -> UpstreamEvents {
        UpstreamEvents {
            shared: Arc::new(Shared {
                capabilities,
                sessions: Mutex::new(Vec::new()),
            }),
        }
    }

    /// What the hub declares to the server in `initialize`.
    pub(crate) fn capabilities(&self) -> &Value {
        &self.shared.capabilities
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

    /// The most recently initialized session that is still open.
    pub(crate) fn attached(&self) -> Option<Arc<PiSession>> {
        let sessions = self
            .shared
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        sessions
            .iter()
            .rev()
            .filter_map(Weak::upgrade)
            .find(|s| !s.ended.is_cancelled())
    }
}
