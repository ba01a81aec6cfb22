//! One of pi's sessions with one server: its streams, its requests in flight, and the server's
//! requests of pi awaiting pi's answer.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::raw::Message;

/// How many messages for pi may wait on one stream (or for a stream to open): a server that floods
/// a stalled client loses what does not fit.
pub(crate) const STREAM_QUEUE: usize = 1024;

/// One of pi's requests in flight: where messages about it go, and how to cancel it.
pub(crate) struct Call {
    /// pi's id for it, as pi wrote it.
    pub(crate) id: Bytes,
    pub(crate) stream: mpsc::Sender<Bytes>,
    pub(crate) cancel: CancellationToken,
}

/// One of pi's sessions with one server.
pub(crate) struct PiSession {
    pub(crate) id: String,
    /// The session's own event stream (`GET`), while pi holds it open.
    pub(crate) standalone: Mutex<Option<mpsc::Sender<Bytes>>>,
    /// Messages that found no stream to go on: sent when pi opens one.
    pub(crate) waiting: Mutex<VecDeque<Bytes>>,
    /// pi's requests being relayed, oldest first.
    pub(crate) calls: Mutex<Vec<Call>>,
    /// The server's requests of pi awaiting pi's answer, by the id the hub gave them.
    pub(crate) asked: Mutex<HashMap<String, oneshot::Sender<Message>>>,
    pub(crate) next_ask: AtomicU64,
    /// Cancelled when the session ends (`DELETE`, or the hub stops).
    pub(crate) ended: CancellationToken,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Puts `message` on `stream` unless it is full or gone, in which case it is handed back.
pub(crate) fn offer(stream: &mpsc::Sender<Bytes>, message: Bytes) -> Result<(), Bytes> {
    stream.try_send(message).map_err(|e| match e {
        mpsc::error::TrySendError::Full(m) | mpsc::error::TrySendError::Closed(m) => m,
    })
}

impl PiSession {
    pub(crate) fn new(id: String, ended: CancellationToken) -> PiSession {
        PiSession {
            id,
            standalone: Mutex::new(None),
            waiting: Mutex::new(VecDeque::new()),
            calls: Mutex::new(Vec::new()),
            asked: Mutex::new(HashMap::new()),
            next_ask: AtomicU64::new(1),
            ended,
        }
    }

    /// A message of the server's that is about none of pi's requests: on the session's own stream,
    /// else on the stream of pi's latest request in flight, else kept until a stream opens.
    pub(crate) fn deliver(&self, message: Bytes) {
        self.deliver_in_order(message, false);
    }

    /// A request of the server's: on the stream of pi's latest request in flight (the one the
    /// server is most likely working on), else as [`PiSession::deliver`].
    pub(crate) fn deliver_request(&self, message: Bytes) {
        self.deliver_in_order(message, true);
    }

    /// The locks are taken in one order everywhere (the session's stream, then pi's requests, then
    /// what waits) and held throughout, so that a stream opening meanwhile cannot miss a message.
    fn deliver_in_order(&self, message: Bytes, call_first: bool) {
        let standalone = lock(&self.standalone);
        let calls = lock(&self.calls);
        let to_call = |message| match calls.last() {
            Some(call) => offer(&call.stream, message),
            None => Err(message),
        };
        let to_standalone = |message| match standalone.as_ref() {
            Some(stream) => offer(stream, message),
            None => Err(message),
        };
        let tried = if call_first {
            to_call(message).or_else(to_standalone)
        } else {
            to_standalone(message).or_else(to_call)
        };
        if let Err(message) = tried {
            let mut waiting = lock(&self.waiting);
            if waiting.len() >= STREAM_QUEUE {
                waiting.pop_front();
            }
            waiting.push_back(message);
        }
    }

    /// Puts the server's `request` to pi under an id of the hub's, at once (so that it keeps its
    /// place among the server's messages); [`Asked::answer`] waits for pi's answer.
    pub(crate) fn ask(self: &Arc<Self>, request: &Message) -> Asked {
        let id = format!("hub-{}", self.next_ask.fetch_add(1, Ordering::Relaxed));
        let (answer, answered) = oneshot::channel();
        lock(&self.asked).insert(id.clone(), answer);
        let quoted = json!(id).to_string();
        self.deliver_request(request.with_id(quoted.as_bytes()));
        Asked {
            session: self.clone(),
            id,
            answered,
        }
    }

    /// pi's answer to one of the server's requests.
    pub(crate) fn answered(&self, message: Message) {
        let Some(id) = message.string_id() else {
            return;
        };
        if let Some(waiter) = lock(&self.asked).remove(&id) {
            let _ = waiter.send(message);
        }
    }

    /// Takes pi's request `id` in flight, its messages to go on `stream`, in the order of
    /// [`PiSession::deliver_in_order`]; with `takes_waiting`, what waited for a stream goes on this
    /// one while the session has none of its own. Its cancel, a child of the session's.
    pub(crate) fn begin_call(
        &self,
        id: &Bytes,
        stream: &mpsc::Sender<Bytes>,
        takes_waiting: bool,
    ) -> CancellationToken {
        let cancel = self.ended.child_token();
        let standalone = lock(&self.standalone);
        lock(&self.calls).push(Call {
            id: id.clone(),
            stream: stream.clone(),
            cancel: cancel.clone(),
        });
        if takes_waiting && standalone.as_ref().is_none_or(mpsc::Sender::is_closed) {
            for waiting in lock(&self.waiting).drain(..) {
                let _ = stream.try_send(waiting);
            }
        }
        cancel
    }

    pub(crate) fn cancel_call(&self, id: &[u8]) {
        for call in lock(&self.calls).iter().filter(|c| c.id == *id) {
            call.cancel.cancel();
        }
    }

    pub(crate) fn end_call(&self, id: &[u8]) {
        let mut calls = lock(&self.calls);
        if let Some(at) = calls.iter().rposition(|c| c.id == *id) {
            calls.remove(at);
        }
    }
}

/// A request of the server's put to pi, awaiting pi's answer.
pub(crate) struct Asked {
    session: Arc<PiSession>,
    id: String,
    answered: oneshot::Receiver<Message>,
}

impl Asked {
    /// pi's answer; the server cancelling (`cancel`) or the session ending gives up, telling pi.
    /// The error is in words for the server.
    pub(crate) async fn answer(self, cancel: &CancellationToken) -> Result<Message, &'static str> {
        let Asked {
            session,
            id,
            answered,
        } = self;
        let outcome = tokio::select! {
            answer = answered => answer.map_err(|_| "pi did not answer"),
            () = cancel.cancelled() => Err("the request was cancelled"),
            () = session.ended.cancelled() => Err("pi's session ended"),
        };
        if lock(&session.asked).remove(&id).is_some() && cancel.is_cancelled() {
            let cancelled = json!({
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": id, "reason": "the server cancelled the request"}
            });
            session.deliver(Bytes::from(cancelled.to_string()));
        }
        outcome
    }
}
