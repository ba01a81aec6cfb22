//! What the two backends store alike, written once: a job's state and ending by name, a job's
//! needs and a worker's labels as JSON text, a worker's card as JSON, and a queued job's state
//! read back. SQLite's columns and Redis's fields hold the same text, so neither can drift. On the
//! job's path: the queue, between the receiver that enqueues a job and the worker that leases it.

use crate::{End, OpenState, QueueError, WorkerCard, WorkerSeen, millis};

/// A job's state as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    Queued,
    Leased,
    Lost,
    Done,
}

impl Stored {
    /// The state by its stored name.
    pub(crate) fn named(name: &str) -> Option<Stored> {
        match name {
            "queued" => Some(Stored::Queued),
            "leased" => Some(Stored::Leased),
            "lost" => Some(Stored::Lost),
            "done" => Some(Stored::Done),
            _ => None,
        }
    }
}

impl End {
    /// A done job's ending by its stored name.
    pub(crate) fn named(name: &str) -> Option<End> {
        match name {
            "finished" => Some(End::Finished),
            "exhausted" => Some(End::Exhausted),
            "lost" => Some(End::Lost),
            "cancelled" => Some(End::Cancelled),
            _ => None,
        }
    }
}

/// A queued job's state at `now` (milliseconds): waiting while its retry is still to come.
pub(crate) fn queued(available_at: i64, now: i64) -> OpenState {
    if available_at > now {
        OpenState::Waiting {
            until: millis::time(available_at),
        }
    } else {
        OpenState::Queued
    }
}

/// A worker's labels as the lease compares them: a JSON array of strings.
pub(crate) fn labels_json(labels: &[String]) -> String {
    serde_json::Value::from(labels.to_vec()).to_string()
}

/// A job's needs as stored: a JSON array of strings, or `None` when it needs nothing.
pub(crate) fn needs_json(needs: &[String]) -> Option<String> {
    (!needs.is_empty()).then(|| labels_json(needs))
}

/// A job's needs read back: none when there are none stored, or none this version reads.
pub(crate) fn needs_of(stored: Option<String>) -> Vec<String> {
    stored
        .and_then(|n| serde_json::from_str(&n).ok())
        .unwrap_or_default()
}

/// A worker's card as stored.
pub(crate) fn card_text(card: &WorkerCard) -> Result<String, QueueError> {
    serde_json::to_string(card).map_err(|e| QueueError::Card(e.to_string()))
}

/// A worker read back, last seen at `last_seen` (milliseconds); `None` for a card another version
/// wrote in a shape this one does not read, which is left out.
pub(crate) fn worker_seen(card: &str, last_seen: i64) -> Option<WorkerSeen> {
    let card = serde_json::from_str(card).ok()?;
    Some(WorkerSeen {
        card,
        last_seen: millis::time(last_seen),
    })
}
