//! The worker's durable job queue: one SQLite file (`<deployment>/state/queue.sqlite3`), behind the
//! [`Queue`] trait so that another backend (Redis or Valkey, for several hosts) can stand in later.
//!
//! A job is `queued` (or waiting for its `available_at` after a retry), `leased` by one worker until
//! its lease lapses, `lost` once a lapsed lease has used every attempt and until [`Queue::take_lost`]
//! reports it, and `done`. A done job keeps its id, attempt and times (so that a repeated delivery
//! is refused) but not its payload. Every change is one SQLite transaction, so a process killed at
//! any point leaves a consistent queue. Time is always passed in. See `docs/queue.md`.

use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ValueRef};
use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};

/// How many leases a job gets, counting the first: a job whose worker died once is run again,
/// twice is lost; a job retried once after an infrastructure fault is exhausted at its next fault.
pub const MAX_ATTEMPTS: u32 = 2;

/// The schema version this code writes and reads (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 1;

/// How long a statement waits for another connection's write transaction before it fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The first schema. `seq` is the enqueue order; times are unix milliseconds. The partial indexes
/// keep leasing and listing independent of how many done jobs the file holds.
const SCHEMA_V1: &str = "
CREATE TABLE jobs (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    payload      TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('queued', 'leased', 'lost', 'done')),
    attempt      INTEGER NOT NULL DEFAULT 0,
    queued_at    INTEGER NOT NULL,
    available_at INTEGER NOT NULL,
    worker       TEXT,
    token        TEXT,
    leased_until INTEGER,
    finished_at  INTEGER,
    outcome      TEXT CHECK (outcome IN ('finished', 'exhausted', 'lost')),
    CHECK ((state = 'leased') = (token IS NOT NULL AND leased_until IS NOT NULL)),
    CHECK ((state = 'done') = (finished_at IS NOT NULL AND outcome IS NOT NULL))
);
CREATE INDEX jobs_open ON jobs (seq) WHERE state <> 'done';
CREATE INDEX jobs_done ON jobs (finished_at) WHERE state = 'done';
";

/// A lapsed lease that has used every attempt becomes lost (run inside each write that looks).
const SWEEP_LOST: &str = "UPDATE jobs SET state = 'lost', token = NULL, leased_until = NULL
    WHERE state = 'leased' AND leased_until < ?1 AND attempt >= ?2";

/// Takes the oldest available job: queued and due, or leased with a lapsed lease and attempts left.
const TAKE_NEXT: &str = "UPDATE jobs
    SET state = 'leased', attempt = attempt + 1, worker = ?2,
        token = lower(hex(randomblob(16))), leased_until = ?3
    WHERE seq = (
        SELECT seq FROM jobs
        WHERE state <> 'done'
          AND ((state = 'queued' AND available_at <= ?1)
            OR (state = 'leased' AND leased_until < ?1 AND attempt < ?4))
        ORDER BY seq LIMIT 1)
    RETURNING id, payload, attempt, token, queued_at";

/// The queue's operations; every time is passed in. Object-safe, so a worker holds a
/// `Box<dyn Queue>` or `Arc<dyn Queue>` whatever the backend.
pub trait Queue: Send + Sync {
    /// Stores a job under `id` with an opaque `payload`, queued at `now`. A job with this id
    /// already in the queue (in any state, done included) is left alone and the answer is `false`,
    /// so a repeated delivery is not run twice.
    fn enqueue(&self, id: &str, payload: &str, now: SystemTime) -> Result<bool, QueueError>;

    /// Takes the oldest available job for `worker` until `now + lease_for`, or `None`. Available:
    /// queued with `available_at <= now`, or leased with a lapsed lease (`leased_until < now`) and
    /// attempts left. Lapsed leases without attempts left become lost first.
    fn lease(
        &self,
        worker: &str,
        lease_for: Duration,
        now: SystemTime,
    ) -> Result<Option<Lease>, QueueError>;

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

    /// Forgets done jobs finished before `before` (their ids may then be enqueued again); returns
    /// how many.
    fn prune_done(&self, before: SystemTime) -> Result<usize, QueueError>;
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
}

/// Where a job not done stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenState {
    /// Available now.
    Queued,
    /// Retried; available from `until`.
    Waiting { until: SystemTime },
    /// Held by `worker` until `until` (lapsed if that is past).
    Leased { worker: String, until: SystemTime },
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
    #[error("the queue cannot {op}")]
    Sqlite {
        op: &'static str,
        #[source]
        source: rusqlite::Error,
    },
}

/// The queue in one SQLite file. Several handles, in one process or several, may share the file:
/// each write is a `BEGIN IMMEDIATE` transaction, in WAL mode, with a busy timeout.
#[derive(Debug)]
pub struct SqliteQueue {
    conn: Mutex<Connection>,
    config: Config,
}

impl SqliteQueue {
    /// Opens the queue at `path` with the default [`Config`]; see [`SqliteQueue::open_with`].
    pub fn open(path: &Path) -> Result<SqliteQueue, QueueError> {
        SqliteQueue::open_with(path, Config::default())
    }

    /// Opens the queue at `path`, creating its folder (0700) and the file (0600) if missing and
    /// the schema if the file is new, and refusing a file written with a newer schema.
    pub fn open_with(path: &Path, config: Config) -> Result<SqliteQueue, QueueError> {
        if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(folder)
                .map_err(|source| QueueError::CreateFolder {
                    path: folder.to_owned(),
                    source,
                })?;
        }
        // SQLite would create the file 0644; its -wal and -shm files take the file's mode.
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|source| QueueError::CreateFile {
                path: path.to_owned(),
                source,
            })?;
        let open_err = |step| {
            move |source| QueueError::Open {
                path: path.to_owned(),
                step,
                source,
            }
        };
        let mut conn = Connection::open(path).map_err(open_err("open"))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(open_err("set the busy timeout"))?;
        let known = |found: i64| {
            if (0..=SCHEMA_VERSION).contains(&found) {
                Ok(found)
            } else {
                Err(QueueError::UnknownSchema {
                    path: path.to_owned(),
                    found,
                })
            }
        };
        // Refuse a newer file before changing anything in it.
        known(user_version(&conn).map_err(open_err("read the schema version"))?)?;
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(open_err("set WAL mode"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(QueueError::NotWal {
                path: path.to_owned(),
                mode,
            });
        }
        // FULL: a job enqueued or finished survives a power cut too, not only a killed process.
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(open_err("set synchronous"))?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(open_err("begin the schema transaction"))?;
        // Read again inside the write lock: another process may have created the schema meanwhile.
        if known(user_version(&tx).map_err(open_err("read the schema version"))?)? == 0 {
            tx.execute_batch(SCHEMA_V1)
                .map_err(open_err("create the schema"))?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(open_err("set the schema version"))?;
        }
        tx.commit().map_err(open_err("commit the schema"))?;
        Ok(SqliteQueue {
            conn: Mutex::new(conn),
            config: Config {
                max_attempts: config.max_attempts.max(1),
                ..config
            },
        })
    }

    /// The connection. A panic while it was held cannot have left a transaction open (a
    /// transaction rolls back when dropped), so a poisoned lock is still a good connection.
    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Queue for SqliteQueue {
    fn enqueue(&self, id: &str, payload: &str, now: SystemTime) -> Result<bool, QueueError> {
        let now = millis(now);
        let added = self
            .conn()
            .execute(
                "INSERT INTO jobs (id, payload, state, queued_at, available_at)
                 VALUES (?1, ?2, 'queued', ?3, ?3) ON CONFLICT (id) DO NOTHING",
                params![id, payload, now],
            )
            .map_err(sqlite("enqueue a job"))?;
        Ok(added == 1)
    }

    fn lease(
        &self,
        worker: &str,
        lease_for: Duration,
        now: SystemTime,
    ) -> Result<Option<Lease>, QueueError> {
        let err = sqlite("lease a job");
        let until = later(millis(now), lease_for);
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        tx.execute(SWEEP_LOST, params![millis(now), self.config.max_attempts])
            .map_err(err)?;
        let lease = tx
            .query_row(
                TAKE_NEXT,
                params![millis(now), worker, until, self.config.max_attempts],
                |row| {
                    Ok(Lease {
                        job_id: row.get(0)?,
                        payload: row.get(1)?,
                        attempt: row.get(2)?,
                        token: row.get(3)?,
                        until: time(until),
                        queued_at: time(row.get(4)?),
                    })
                },
            )
            .optional()
            .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(lease)
    }

    fn renew(
        &self,
        lease: &Lease,
        lease_for: Duration,
        now: SystemTime,
    ) -> Result<bool, QueueError> {
        let changed = self
            .conn()
            .execute(
                "UPDATE jobs SET leased_until = ?3
                 WHERE id = ?1 AND token = ?2 AND state = 'leased'",
                params![lease.job_id, lease.token, later(millis(now), lease_for)],
            )
            .map_err(sqlite("renew a lease"))?;
        Ok(changed == 1)
    }

    fn finish(&self, lease: &Lease, now: SystemTime) -> Result<bool, QueueError> {
        let changed = self
            .conn()
            .execute(
                "UPDATE jobs SET state = 'done', outcome = 'finished', finished_at = ?3,
                     payload = '', token = NULL, leased_until = NULL
                 WHERE id = ?1 AND token = ?2 AND state = 'leased'",
                params![lease.job_id, lease.token, millis(now)],
            )
            .map_err(sqlite("finish a job"))?;
        Ok(changed == 1)
    }

    fn retry(&self, lease: &Lease, now: SystemTime) -> Result<RetryDecision, QueueError> {
        let err = sqlite("retry a job");
        let now = millis(now);
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let attempt: Option<u32> = tx
            .query_row(
                "SELECT attempt FROM jobs WHERE id = ?1 AND token = ?2 AND state = 'leased'",
                params![lease.job_id, lease.token],
                |row| row.get(0),
            )
            .optional()
            .map_err(err)?;
        let decision = match attempt {
            None => RetryDecision::NotHeld,
            Some(attempt) if attempt < self.config.max_attempts => {
                let available_at = later(now, self.config.backoff.after(attempt));
                tx.execute(
                    "UPDATE jobs SET state = 'queued', available_at = ?2,
                         worker = NULL, token = NULL, leased_until = NULL
                     WHERE id = ?1",
                    params![lease.job_id, available_at],
                )
                .map_err(err)?;
                RetryDecision::Requeued {
                    available_at: time(available_at),
                }
            }
            Some(_) => {
                tx.execute(
                    "UPDATE jobs SET state = 'done', outcome = 'exhausted', finished_at = ?2,
                         payload = '', token = NULL, leased_until = NULL
                     WHERE id = ?1",
                    params![lease.job_id, now],
                )
                .map_err(err)?;
                RetryDecision::Exhausted
            }
        };
        tx.commit().map_err(err)?;
        Ok(decision)
    }

    fn take_lost(&self, now: SystemTime) -> Result<Vec<LostJob>, QueueError> {
        let err = sqlite("take the lost jobs");
        let now = millis(now);
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        tx.execute(SWEEP_LOST, params![now, self.config.max_attempts])
            .map_err(err)?;
        let lost = {
            // `state <> 'done'` lets SQLite read the open-jobs index rather than every row.
            let mut stmt = tx
                .prepare(
                    "SELECT id, payload, attempt FROM jobs
                     WHERE state <> 'done' AND state = 'lost' ORDER BY seq",
                )
                .map_err(err)?;
            let rows = stmt
                .query_map([], |row| {
                    Ok(LostJob {
                        job_id: row.get(0)?,
                        payload: row.get(1)?,
                        attempt: row.get(2)?,
                    })
                })
                .map_err(err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(err)?
        };
        tx.execute(
            "UPDATE jobs SET state = 'done', outcome = 'lost', finished_at = ?1, payload = ''
             WHERE state = 'lost'",
            params![now],
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(lost)
    }

    fn status(&self, now: SystemTime, recent_done: usize) -> Result<Status, QueueError> {
        let err = sqlite("read the queue's status");
        let now = millis(now);
        let mut conn = self.conn();
        // One read transaction: the three reads see the same moment.
        let tx = conn.transaction().map_err(err)?;
        let open = {
            let mut stmt = tx
                .prepare(
                    "SELECT id, state, attempt, queued_at, available_at, worker, leased_until
                     FROM jobs WHERE state <> 'done' ORDER BY seq",
                )
                .map_err(err)?;
            let rows = stmt
                .query_map([], |row| {
                    let state = match row.get::<_, Stored>(1)? {
                        Stored::Queued => {
                            let available_at: i64 = row.get(4)?;
                            if available_at > now {
                                OpenState::Waiting {
                                    until: time(available_at),
                                }
                            } else {
                                OpenState::Queued
                            }
                        }
                        Stored::Leased => OpenState::Leased {
                            worker: row.get::<_, Option<String>>(5)?.unwrap_or_default(),
                            until: time(row.get(6)?),
                        },
                        // Done rows are not selected.
                        Stored::Lost | Stored::Done => OpenState::Lost,
                    };
                    Ok(OpenJob {
                        id: row.get(0)?,
                        state,
                        attempt: row.get(2)?,
                        queued_at: time(row.get(3)?),
                    })
                })
                .map_err(err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(err)?
        };
        let done: i64 = tx
            .query_row(
                "SELECT count(*) FROM jobs WHERE state = 'done'",
                [],
                |row| row.get(0),
            )
            .map_err(err)?;
        let recent = {
            let mut stmt = tx
                .prepare(
                    "SELECT id, attempt, finished_at, outcome FROM jobs WHERE state = 'done'
                     ORDER BY finished_at DESC, seq DESC LIMIT ?1",
                )
                .map_err(err)?;
            let limit = i64::try_from(recent_done).unwrap_or(i64::MAX);
            let rows = stmt
                .query_map([limit], |row| {
                    Ok(DoneJob {
                        id: row.get(0)?,
                        attempt: row.get(1)?,
                        finished_at: time(row.get(2)?),
                        end: row.get(3)?,
                    })
                })
                .map_err(err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(err)?
        };
        tx.commit().map_err(err)?;
        let mut counts = Counts {
            done: usize::try_from(done).unwrap_or(usize::MAX),
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
        Ok(Status {
            open,
            counts,
            recent_done: recent,
        })
    }

    fn prune_done(&self, before: SystemTime) -> Result<usize, QueueError> {
        self.conn()
            .execute(
                "DELETE FROM jobs WHERE state = 'done' AND finished_at < ?1",
                params![millis(before)],
            )
            .map_err(sqlite("prune done jobs"))
    }
}

/// A job's state as the file stores it.
enum Stored {
    Queued,
    Leased,
    Lost,
    Done,
}

impl FromSql for Stored {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Stored> {
        match value.as_str()? {
            "queued" => Ok(Stored::Queued),
            "leased" => Ok(Stored::Leased),
            "lost" => Ok(Stored::Lost),
            "done" => Ok(Stored::Done),
            _ => Err(FromSqlError::InvalidType),
        }
    }
}

impl FromSql for End {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<End> {
        match value.as_str()? {
            "finished" => Ok(End::Finished),
            "exhausted" => Ok(End::Exhausted),
            "lost" => Ok(End::Lost),
            _ => Err(FromSqlError::InvalidType),
        }
    }
}

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

fn sqlite(op: &'static str) -> impl Fn(rusqlite::Error) -> QueueError + Copy {
    move |source| QueueError::Sqlite { op, source }
}

/// `t` as unix milliseconds, as the file stores times (0 before 1970).
fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Unix milliseconds `ms` as a time (1970 for a negative value).
fn time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// `d` after `ms`, in milliseconds.
fn later(ms: i64, d: Duration) -> i64 {
    ms.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
