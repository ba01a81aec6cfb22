//! What the worker's loop runs with and what it did, around the job's path: its options (the
//! slots, the lease, the disk gate, retention, the heartbeat), read by the slots, and its summary.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Duration;

/// How the loop runs.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    /// This worker's name in the queue (host and pid).
    pub worker_id: String,
    /// How long a lease lasts without renewal; it is renewed every third of that.
    pub lease_for: Duration,
    pub concurrency: u32,
    /// Stops once the queue has nothing open (for `--until-empty` and tests); otherwise run until
    /// told to stop.
    pub until_empty: bool,
    /// How long an idle slot waits before asking the queue again.
    pub poll: Duration,
    /// How often a running job's cancel mark is looked at.
    pub cancel_poll: Duration,
    /// `PI_ON_FAILURE`.
    pub on_failure: Option<PathBuf>,
    /// The room a job needs on the deployment's disk to start; `None` starts jobs whatever the
    /// disk holds.
    pub disk: Option<DiskGate>,
    /// What a settled job's folder keeps; `None` leaves it whole.
    pub retention: Option<crate::retention::Retention>,
    /// The labels the worker takes jobs for (`host:NAME` among them): it takes a job only when it
    /// carries every label the job needs.
    pub labels: Vec<String>,
    /// How the worker tells the queue it is alive; `None`: it does not (a bench).
    pub heartbeat: Option<Heartbeat>,
    /// Whether running jobs are shown live ([`records::live`]).
    pub live: bool,
}

/// The worker's announcements: its card, sent when it starts and every `every`, with the jobs it
/// runs and whether it drains; it leaves the queue's list when it stops.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    pub card: queue::WorkerCard,
    pub every: Duration,
}

/// No job starts while the file system holding `folder` has less than `min_free` bytes free
/// (`PI_DISK_MIN_MB`): the jobs wait in the queue, and the worker says so once.
#[derive(Debug, Clone)]
pub struct DiskGate {
    /// The deployment's state folder.
    pub folder: PathBuf,
    pub min_free: u64,
}

/// What the loop did.
#[derive(Debug, Default)]
pub struct Summary {
    pub records: AtomicUsize,
    pub retries: AtomicUsize,
    pub handed_back: AtomicUsize,
    /// Whether the disk is nearly full now (said once when it becomes so, once when it is not).
    pub disk_full: AtomicBool,
    /// Jobs running now.
    pub running: AtomicUsize,
}
