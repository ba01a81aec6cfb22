//! What became of a job, as the worker loop reads it, and what tells a running job to stop.

use tokio::sync::watch;

use protocol::reason::Reason;
use records::record::Record;

/// What became of the job.
#[derive(Debug)]
pub enum Verdict {
    /// It ended, as this record says. Whether it is run again is its reason's to say
    /// ([`Reason::retried`]): nothing else decides it.
    Ended(Box<Record>),
    /// The worker is stopping: give the job back to the queue at once, with no record.
    HandBack,
}

impl From<Record> for Verdict {
    fn from(record: Record) -> Verdict {
        Verdict::Ended(Box::new(record))
    }
}

/// Whether the job that ended as `record` says is run again (attempts left): its reason's row.
pub fn retried(record: &Record) -> bool {
    record.reason.is_some_and(Reason::retried)
}

/// Why a job is stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    /// The operator cancelled it (`pi-dispatch cancel`).
    Cancelled,
    /// The worker is shutting down and hands its jobs back.
    Shutdown,
}

/// Tells a running job to stop: `None` until it must.
pub type StopSignal = watch::Receiver<Option<StopCause>>;

/// Waits until `stop` says why the job must stop (never, if its sender goes away).
pub async fn stopped(stop: &mut StopSignal) -> StopCause {
    loop {
        if let Some(cause) = *stop.borrow_and_update() {
            return cause;
        }
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
