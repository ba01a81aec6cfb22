//! What became of a job, as the worker loop reads it, and what tells a running job to stop.

use tokio::sync::watch;

use protocol::admitted::Flow;
use protocol::reason::Reason;
use records::record::Record;

/// What became of the job.
#[derive(Debug)]
pub enum Verdict {
    /// It ended, as its record says. Whether it is run again is its reason's to say
    /// ([`Reason::retried`]): nothing else decides it.
    Ended(Box<Ended>),
    /// The worker is stopping: give the job back to the queue at once, with no record.
    HandBack,
}

/// A job that ended: its record, and what its comment needs of its plan.
#[derive(Debug)]
pub struct Ended {
    pub record: Record,
    /// A forge job's flow, as its plan says (`None` before the admission let it through): what a
    /// completed job's comment says.
    pub flow: Option<Flow>,
}

impl From<Record> for Verdict {
    fn from(record: Record) -> Verdict {
        Verdict::Ended(Box::new(Ended { record, flow: None }))
    }
}

impl Verdict {
    /// The verdict on a job whose plan has `flow` (a forge job's).
    pub fn with_flow(self, flow: Option<Flow>) -> Verdict {
        match self {
            Verdict::Ended(ended) => Verdict::Ended(Box::new(Ended { flow, ..*ended })),
            Verdict::HandBack => Verdict::HandBack,
        }
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
