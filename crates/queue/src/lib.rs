//! The worker's durable job queue, behind the [`Queue`] trait: the embedded default is one SQLite
//! file ([`SqliteQueue`], `<deployment>/state/queue.sqlite3`); for workers on several hosts, one
//! Redis ([`RedisQueue`], `PI_QUEUE=redis://...`). [`open`] picks the backend from the settings,
//! so no caller names one.
//!
//! A job is `queued` (or waiting for its `available_at` after a retry), `leased` by one worker until
//! its lease lapses, `lost` once a lapsed lease has used every attempt and until [`Queue::take_lost`]
//! reports it, and `done`. A done job keeps its id, attempt and times (so that a repeated delivery
//! is refused) but not its payload. Time is always passed in. See `docs/queue.md`.
//!
//! On the job's path: its first stop: cron, `run` and the receiver put the job here, and a worker
//! leases it.

use std::path::{Path, PathBuf};

use config::settings::QueueBackend;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

mod millis;
pub mod records;
mod redis_queue;
mod redis_records;
mod sqlite;
mod sqlite_records;
mod stored;

pub use records::{Cursor, FoundRecord, RecordEntry, RecordFilter, RecordIndex, RecordKeys};
pub use redis_queue::{DEFAULT_OUTAGE_LIMIT, PREFIX, RedisQueue, RedisTarget};
pub use sqlite::{SCHEMA_VERSION, SqliteQueue};

/// How many leases a job gets, counting the first: a job whose worker died once is run again,
/// twice is lost; a job retried once after an infrastructure fault is exhausted at its next fault.
pub const MAX_ATTEMPTS: u32 = 2;

/// The queue file of a deployment, for the embedded backend.
pub fn sqlite_path(deployment: &Path) -> PathBuf {
    deployment.join("state").join("queue.sqlite3")
}

/// The deployment's queue, as its settings choose it: the SQLite file, or the Redis of `PI_QUEUE`
/// signed in to with `password` (`PI_QUEUE_PASSWORD`, from the worker's environment).
pub fn open(
    settings: &config::settings::Settings,
    password: Option<String>,
) -> Result<Arc<dyn Queue>, QueueError> {
    Ok(match &settings.queue {
        QueueBackend::Sqlite => Arc::new(SqliteQueue::open(&sqlite_path(&settings.dir))?),
        QueueBackend::Redis { url } => Arc::new(RedisQueue::open(&RedisTarget {
            url: url.clone(),
            password,
        })?),
    })
}

/// Whether the deployment's queue exists yet (a command that only reads need not create it); a
/// Redis queue always does.
pub fn exists(settings: &config::settings::Settings) -> bool {
    match settings.queue {
        QueueBackend::Sqlite => sqlite_path(&settings.dir).exists(),
        QueueBackend::Redis { .. } => true,
    }
}

/// The queue's operations; every time is passed in. Object-safe, so a worker holds a
/// `Box<dyn Queue>` or `Arc<dyn Queue>` whatever the backend.
pub trait Queue: Send + Sync {
    /// Stores `job` (its id, opaque payload and placement), queued at `now`. A job with this id
    /// already in the queue (in any state, done included) is left alone and the answer is `false`,
    /// so a repeated delivery is not run twice. A job that supersedes marks the other jobs of its
    /// group for cancelling (see [`Placement::supersede`]).
    fn enqueue_job(&self, job: &NewJob, now: SystemTime) -> Result<bool, QueueError>;

    /// [`Queue::enqueue_job`] for a job any worker may take, in no group.
    fn enqueue(&self, id: &str, payload: &str, now: SystemTime) -> Result<bool, QueueError> {
        self.enqueue_job(&NewJob::plain(id, payload), now)
    }

    /// Takes the oldest available job for `worker`, which carries `labels`, until
    /// `now + lease_for`, or `None`. Available: queued with `available_at <= now`, or leased with
    /// a lapsed lease (`leased_until < now`) and attempts left; every label the job needs among
    /// `labels`; and, in a group, the oldest of its group not done. Lapsed leases without attempts
    /// left become lost first.
    fn lease_as(
        &self,
        worker: &str,
        labels: &[String],
        lease_for: Duration,
        now: SystemTime,
    ) -> Result<Option<Lease>, QueueError>;

    /// [`Queue::lease_as`] for a worker without labels: it takes only jobs that need none.
    fn lease(
        &self,
        worker: &str,
        lease_for: Duration,
        now: SystemTime,
    ) -> Result<Option<Lease>, QueueError> {
        self.lease_as(worker, &[], lease_for, now)
    }

    /// Says that `card`'s worker is alive at `now` (a worker calls it when it starts and then
    /// every heartbeat). Workers unseen for [`FORGET_WORKERS_AFTER`] are forgotten meanwhile.
    fn announce(&self, card: &WorkerCard, now: SystemTime) -> Result<(), QueueError>;

    /// Every worker announced and not forgotten, by id, with when each was last seen.
    fn workers(&self) -> Result<Vec<WorkerSeen>, QueueError>;

    /// Forgets worker `id` (it stopped cleanly).
    fn leave(&self, id: &str) -> Result<(), QueueError>;

    /// Stores what running job `job_id` shows live: `snapshot` (opaque) replaces the one before,
    /// and `lines` (its redacted transcript so far, opaque) follow those stored; written by the
    /// job's worker, which bounds them.
    fn live_put(
        &self,
        job_id: &str,
        snapshot: &str,
        lines: &[String],
        now: SystemTime,
    ) -> Result<(), QueueError>;

    /// What job `job_id` shows live, with at most `max` of its lines from line `from` (counting
    /// from 0); `None` when it has shown nothing (not started, or long over).
    fn live_get(&self, job_id: &str, from: u64, max: usize)
    -> Result<Option<LiveView>, QueueError>;

    /// Forgets what jobs showed live, for those last written before `before`; how many.
    fn live_prune(&self, before: SystemTime) -> Result<usize, QueueError>;

    /// Notes that job `rerun` runs job `original` again (a record is written once, so the link
    /// from the original is kept here).
    fn link_rerun(&self, original: &str, rerun: &str) -> Result<(), QueueError>;

    /// The jobs that ran job `original` again, oldest first.
    fn reruns(&self, original: &str) -> Result<Vec<String>, QueueError>;

    /// Extends a lease still held to `now + lease_for`; `false` if the job is no longer this
    /// lease's (taken over by another lease, finished, retried or lost). A lapsed lease that no one
    /// has taken over is still held.
    fn renew(
        &self,
        lease: &Lease,
        lease_for: Duration,
        now: SystemTime,
    ) -> Result<bool, QueueError>;

    /// Marks the job done at `now`, whatever its outcome (completed, refused, failed); `false` if
    /// the lease is no longer held, and then nothing changes.
    fn finish(&self, lease: &Lease, now: SystemTime) -> Result<bool, QueueError>;

    /// An infrastructure fault: the job waits out a backoff and is available again, or, with no
    /// attempt left, is done. Never for a policy refusal (that is [`Queue::finish`]).
    fn retry(&self, lease: &Lease, now: SystemTime) -> Result<RetryDecision, QueueError>;

    /// The lost jobs, each reported once: they are done (outcome lost) when this returns. The
    /// worker writes a record for each; a crash between this call and that record loses the record,
    /// not the job's `done` row.
    fn take_lost(&self, now: SystemTime) -> Result<Vec<LostJob>, QueueError>;

    /// Every job not done, oldest first, with counts, and the `recent_done` most recently done.
    /// Reads only: a lapsed lease shows as leased until a `lease` or `take_lost` call settles it.
    fn status(&self, now: SystemTime, recent_done: usize) -> Result<Status, QueueError>;

    /// Stores the jobs one forge delivery queues (each `(id, payload)`) and the delivery's key in
    /// one step. A key stored before stores nothing and answers `false`: a delivery the forge sends
    /// again queues nothing, even when the triggers changed meanwhile. A delivery that queues no job
    /// is remembered too. A job id already in the queue is left alone, as in [`Queue::enqueue`].
    fn enqueue_delivery(
        &self,
        key: &str,
        jobs: &[NewJob],
        now: SystemTime,
    ) -> Result<bool, QueueError>;

    /// Forgets done jobs finished before `before` (their ids may then be enqueued again), and the
    /// deliveries seen before it; returns how many jobs.
    fn prune_done(&self, before: SystemTime) -> Result<usize, QueueError>;

    /// Cancels job `id`. A job not running (queued, waiting to retry, lost, or leased by a worker
    /// whose lease lapsed) is done at once, outcome cancelled, and its payload handed back for its
    /// record; a running one is marked, and the worker holding it stops it
    /// ([`Queue::cancel_requested`]). A marked job is never leased again.
    fn cancel(&self, id: &str, now: SystemTime) -> Result<Cancel, QueueError>;

    /// Whether the lease is still held, and whether its job is marked for cancelling.
    fn lease_state(&self, lease: &Lease) -> Result<LeaseState, QueueError>;

    /// The pin of MCP server `server` (opaque text the worker writes: what the server listed when
    /// it was approved), when it has one. Every worker on the queue shares it.
    fn pin(&self, server: &str) -> Result<Option<String>, QueueError>;

    /// Every server's pin, by server name.
    fn pins(&self) -> Result<Vec<(String, String)>, QueueError>;

    /// Stores `pin` for `server` at `now` and forgets the drift noted for it. With `first`, only
    /// when the server has no pin yet (a server's first job pins it; of two such jobs at once, the
    /// first to store stays); whether it was stored.
    fn put_pin(
        &self,
        server: &str,
        pin: &str,
        first: bool,
        now: SystemTime,
    ) -> Result<bool, QueueError>;

    /// Notes what the last job to see `server` differ from its pin saw (opaque text), replacing
    /// what was noted before.
    fn put_pin_drift(&self, server: &str, drift: &str, now: SystemTime) -> Result<(), QueueError>;

    /// Every drift noted and not yet approved (by [`Queue::put_pin`]), by server name.
    fn pin_drifts(&self) -> Result<Vec<(String, String)>, QueueError>;

    /// Hands a leased job back at once (a worker that drains): queued, available now, and this
    /// attempt not counted. `false` if the lease is no longer held.
    fn release(&self, lease: &Lease, now: SystemTime) -> Result<bool, QueueError>;
}

/// How long a worker that stopped announcing itself is still listed (as gone).
pub const FORGET_WORKERS_AFTER: Duration = Duration::from_secs(24 * 3600);

/// A job to queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    pub id: String,
    /// The job as queued (opaque to the queue).
    pub payload: String,
    pub placement: Placement,
}

impl NewJob {
    /// A job any worker may take, in no group.
    pub fn plain(id: &str, payload: &str) -> NewJob {
        NewJob {
            id: id.to_owned(),
            payload: payload.to_owned(),
            placement: Placement::default(),
        }
    }

    /// `job` as queued: its JSON, the labels it needs ([`Job::needs`]) and its group
    /// ([`Job::group`]); it supersedes nothing.
    pub fn of(job: &protocol::job::Job) -> Result<NewJob, serde_json::Error> {
        Ok(NewJob {
            id: job.id.clone(),
            payload: serde_json::to_string(job)?,
            placement: Placement {
                needs: job.needs(),
                group: job.group(),
                supersede: false,
            },
        })
    }
}

/// Where a job may run, and beside which others.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// The labels a worker must carry, every one, to take the job; empty: any worker.
    pub needs: Vec<String>,
    /// Jobs of one group run one at a time, oldest first (a forge issue's jobs).
    pub group: Option<String>,
    /// Queuing this job cancels the older jobs of its group not done: a queued one is reported by
    /// [`Queue::take_lost`] as cancelled, a running one is stopped by its worker.
    pub supersede: bool,
}

/// What a worker says of itself in the queue.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerCard {
    /// Its name in the queue's leases (`host:pid`).
    pub id: String,
    pub host: String,
    pub pid: u32,
    /// The pi-dispatch version it runs.
    pub version: String,
    /// The labels it takes jobs for, `host:NAME` among them.
    pub labels: Vec<String>,
    pub concurrency: u32,
    pub started_ms: u64,
    /// Jobs it runs now.
    pub running: u32,
    /// It takes no new job (stopping).
    pub draining: bool,
}

/// What a job shows live, as [`Queue::live_get`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveView {
    pub snapshot: String,
    /// The lines asked for.
    pub lines: Vec<String>,
    /// How many lines are stored in all.
    pub total: u64,
    pub updated: SystemTime,
}

/// A worker as the queue last heard of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSeen {
    pub card: WorkerCard,
    pub last_seen: SystemTime,
}

/// Where a lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    Held,
    /// Held, and the job is marked for cancelling: its worker stops it.
    CancelRequested,
    /// No longer this lease's (taken over, finished, retried, handed back or cancelled).
    Lost,
}

/// What [`Queue::cancel`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancel {
    /// It was not running: it is done (cancelled), and this was its payload.
    Removed { payload: String, attempt: u32 },
    /// It is running: its worker stops it and writes its record.
    Stopping { worker: String },
    /// It was done already.
    AlreadyDone,
    /// No job has that id.
    Unknown,
}

/// A job leased to one worker. `token` tells this lease from any later lease of the same job, so
/// a worker that lost its lease cannot renew, finish or retry the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub job_id: String,
    pub payload: String,
    /// 1 on the first lease.
    pub attempt: u32,
    pub token: String,
    /// When the lease lapses unless renewed.
    pub until: SystemTime,
    /// When the job was enqueued.
    pub queued_at: SystemTime,
}

/// What [`Queue::retry`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Available again from `available_at`.
    Requeued { available_at: SystemTime },
    /// Every attempt is used: the job is done.
    Exhausted,
    /// The lease is no longer held; nothing changed.
    NotHeld,
}

/// A job whose lease lapsed on its last attempt (its worker died, twice by default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostJob {
    pub job_id: String,
    pub payload: String,
    pub attempt: u32,
    /// It was marked for cancelling when its worker disappeared.
    pub cancelled: bool,
}

/// What [`Queue::status`] shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Every job not done, in enqueue order.
    pub open: Vec<OpenJob>,
    pub counts: Counts,
    /// The most recently done jobs, newest first.
    pub recent_done: Vec<DoneJob>,
}

impl Status {
    /// The status of these open jobs (counted by state), `done` done ones and the recent ones.
    pub(crate) fn new(open: Vec<OpenJob>, done: usize, recent_done: Vec<DoneJob>) -> Status {
        let mut counts = Counts {
            done,
            ..Counts::default()
        };
        for job in &open {
            match job.state {
                OpenState::Queued => counts.queued += 1,
                OpenState::Waiting { .. } => counts.waiting += 1,
                OpenState::Leased { .. } => counts.leased += 1,
                OpenState::Lost => counts.lost += 1,
            }
        }
        Status {
            open,
            counts,
            recent_done,
        }
    }
}

/// How many jobs are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub queued: usize,
    pub waiting: usize,
    pub leased: usize,
    pub lost: usize,
    pub done: usize,
}

/// A job not done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenJob {
    pub id: String,
    pub state: OpenState,
    /// Leases so far.
    pub attempt: u32,
    pub queued_at: SystemTime,
    /// The job as queued (opaque to the queue).
    pub payload: String,
    /// Marked for cancelling; its worker is stopping it.
    pub cancel_requested: bool,
    /// The labels a worker needs to take it.
    pub needs: Vec<String>,
    /// Its group (jobs of one group run one at a time).
    pub group: Option<String>,
}

/// Where a job not done stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenState {
    /// Available now.
    Queued,
    /// Retried; available from `until`.
    Waiting { until: SystemTime },
    /// Held by `worker` since `since` (its lease taken), until `until` (lapsed if that is past).
    Leased {
        worker: String,
        until: SystemTime,
        since: SystemTime,
    },
    /// Lapsed on its last attempt; waiting for [`Queue::take_lost`].
    Lost,
}

/// A done job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoneJob {
    pub id: String,
    pub attempt: u32,
    pub finished_at: SystemTime,
    pub end: End,
}

/// How a job came to be done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// [`Queue::finish`]: completed, refused or failed; the worker's record says which.
    Finished,
    /// [`Queue::retry`] with no attempt left.
    Exhausted,
    /// Reported by [`Queue::take_lost`].
    Lost,
    /// [`Queue::cancel`] of a job that was not running, or a marked job whose worker was lost (a
    /// running job its worker stops is finished: its record says cancelled).
    Cancelled,
}

/// How long a retried job waits: `first × 2^(attempt − 1)`, at most `cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub cap: Duration,
}

impl Backoff {
    /// The wait after a fault on `attempt` (1 for the first lease).
    pub fn after(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
        self.first.saturating_mul(factor).min(self.cap)
    }
}

impl Default for Backoff {
    /// 5 s, then 10 s, 20 s, ..., at most 5 minutes.
    fn default() -> Backoff {
        Backoff {
            first: Duration::from_secs(5),
            cap: Duration::from_secs(300),
        }
    }
}

/// A queue's policy. Every handle on one file should use the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Leases a job gets, counting the first; at least 1.
    pub max_attempts: u32,
    pub backoff: Backoff,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_attempts: MAX_ATTEMPTS,
            backoff: Backoff::default(),
        }
    }
}

/// What failed. Messages name the file or the operation, never a job's payload.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("cannot create the queue's folder {}", path.display())]
    CreateFolder {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create the queue file {}", path.display())]
    CreateFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the queue file {} ({step})", path.display())]
    Open {
        path: PathBuf,
        step: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "the queue file {} has schema version {found}, which this pi-dispatch does not know (it \
         knows up to {SCHEMA_VERSION}); a newer pi-dispatch wrote it",
        path.display()
    )]
    UnknownSchema { path: PathBuf, found: i64 },
    #[error("the queue file {} is in {mode} journal mode and cannot be put in WAL mode", path.display())]
    NotWal { path: PathBuf, mode: String },
    #[error("the queue in Redis cannot {op}: {detail}")]
    Redis { op: &'static str, detail: String },
    #[error("a worker's card cannot be written: {0}")]
    Card(String),
    #[error("the queue cannot {op}")]
    Sqlite {
        op: &'static str,
        #[source]
        source: rusqlite::Error,
    },
}

#[cfg(test)]
mod shared_tests;
