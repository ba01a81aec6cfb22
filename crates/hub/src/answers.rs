//! pi's side of the relay's results: each of pi's sessions is rmcp's own (its session manager, its
//! event streams), but the answer to one of pi's requests leaves with the server's own text of the
//! result (kept by [`crate::raw::RawResults`]) in place of rmcp's typed reading of it. The handler
//! puts that text here under the session and the request it answers; the session's transport swaps
//! it in as the response goes out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::Stream;
use rmcp::RoleServer;
use rmcp::model::ClientJsonRpcMessage;
use rmcp::model::{CustomResult, JsonRpcMessage, RequestId, ServerJsonRpcMessage, ServerResult};
use rmcp::service::{RequestContext, RxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, LocalSessionWorker,
};
use rmcp::transport::streamable_http_server::{
    RestoreOutcome, SessionId, SessionManager, session::ServerSseMessage,
};
use rmcp::transport::worker::WorkerTransport;
use serde_json::Value;

/// One of pi's requests: its session's id and its own.
pub(crate) type AnswerKey = (String, RequestId);

/// Results waiting to go to pi, by [`AnswerKey`].
pub(crate) type Answers = Arc<Mutex<HashMap<AnswerKey, Value>>>;

pub(crate) fn lock_answers(answers: &Answers) -> MutexGuard<'_, HashMap<AnswerKey, Value>> {
    answers.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The key of the request `context` handles: `None` when its session is not known (the
/// `initialize` request, which opens it).
pub(crate) fn answer_key(context: &RequestContext<RoleServer>) -> Option<AnswerKey> {
    let parts = context.extensions.get::<::http::request::Parts>()?;
    let session = parts.headers.get("mcp-session-id")?.to_str().ok()?;
    Some((session.to_owned(), context.id.clone()))
}

/// rmcp's local session manager, each session's transport wrapped in [`RawAnswer`].
pub(crate) struct RawSessions {
    pub(crate) local: LocalSessionManager,
    pub(crate) answers: Answers,
}

impl RawSessions {
    fn wrap(&self, id: &SessionId, inner: WorkerTransport<LocalSessionWorker>) -> RawAnswer {
        RawAnswer {
            inner,
            session: id.to_string(),
            answers: self.answers.clone(),
        }
    }
}

impl SessionManager for RawSessions {
    type Error = LocalSessionManagerError;
    type Transport = RawAnswer;

    async fn create_session(&self) -> Result<(SessionId, RawAnswer), Self::Error> {
        let (id, inner) = self.local.create_session().await?;
        let transport = self.wrap(&id, inner);
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.local.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.local.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        // Whatever still waited for this session goes with it.
        lock_answers(&self.answers).retain(|(session, _), _| **session != **id);
        self.local.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.local.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.local.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.local.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.local.resume(id, last_event_id).await
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<RawAnswer>, Self::Error> {
        Ok(match self.local.restore_session(id.clone()).await? {
            RestoreOutcome::Restored(inner) => RestoreOutcome::Restored(self.wrap(&id, inner)),
            RestoreOutcome::AlreadyPresent => RestoreOutcome::AlreadyPresent,
            _ => RestoreOutcome::NotSupported,
        })
    }

    fn event_store(
        &self,
    ) -> Option<Arc<dyn rmcp::transport::streamable_http_server::session::EventStore>> {
        self.local.event_store()
    }
}

/// One session's transport: a response whose result the handler left in [`Answers`] goes out with
/// that result; an error response drops what was left for it.
pub(crate) struct RawAnswer {
    inner: WorkerTransport<LocalSessionWorker>,
    session: String,
    answers: Answers,
}

impl Transport<RoleServer> for RawAnswer {
    type Error = <WorkerTransport<LocalSessionWorker> as Transport<RoleServer>>::Error;

    fn send(
        &mut self,
        mut item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        match &mut item {
            JsonRpcMessage::Response(response) => {
                let key = (self.session.clone(), response.id.clone());
                if let Some(raw) = lock_answers(&self.answers).remove(&key) {
                    response.result = ServerResult::CustomResult(CustomResult(raw));
                }
            }
            JsonRpcMessage::Error(error) => {
                if let Some(id) = &error.id {
                    lock_answers(&self.answers).remove(&(self.session.clone(), id.clone()));
                }
            }
            _ => {}
        }
        self.inner.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        self.inner.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}
