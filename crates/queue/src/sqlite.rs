//! The queue in one SQLite file. Every change is one SQLite transaction, so a process killed at
//! any point leaves a consistent queue.

use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ValueRef};
use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};

use crate::millis;
use crate::stored::{self, Stored};
use crate::{
    Cancel, Config, DoneJob, End, Lease, LeaseState, LiveView, LostJob, NewJob, OpenJob, OpenState,
    Queue, QueueError, RetryDecision, Status, WorkerCard, WorkerSeen,
};

/// The schema version this code writes and reads (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 6;

/// How long a statement waits for another connection's write transaction before it fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The table of schema 2. `seq` is the enqueue order; times are unix milliseconds.
/// `cancel_requested` marks a running job its worker is to stop.
const JOBS_V2: &str = "
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
    outcome      TEXT CHECK (outcome IN ('finished', 'exhausted', 'lost', 'cancelled')),
    cancel_requested INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    leased_at    INTEGER,
    CHECK ((state = 'leased') = (token IS NOT NULL AND leased_until IS NOT NULL)),
    CHECK ((state = 'done') = (finished_at IS NOT NULL AND outcome IS NOT NULL))
);
";

/// Schema 3: the forge deliveries seen (`key` is `forge:delivery-id`), so that a delivery sent
/// again queues nothing.
const DELIVERIES_V3: &str = "
CREATE TABLE deliveries (
    key     TEXT PRIMARY KEY,
    seen_at INTEGER NOT NULL
);
";

/// Schema 4: the records (each job's, written once, as text with the keys it is found by), an
/// index for each way operators ask for them (newest first within each, and holding every key,
/// so that the other conditions of a search are checked in the index and only the records
/// returned are read), the deployment's
/// counters, which records add to and pruning never lowers, and how many records are kept
/// (counting a million rows for a gauge would take a scrape's whole budget).
const RECORDS_V4: &str = "
CREATE TABLE records (
    id            TEXT PRIMARY KEY,
    finished_at   INTEGER NOT NULL,
    outcome       TEXT NOT NULL,
    reason        TEXT,
    trigger_index INTEGER,
    trigger_type  TEXT NOT NULL,
    repo          TEXT,
    folder        TEXT,
    body          TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX records_newest ON records
    (finished_at, id, outcome, reason, trigger_index, trigger_type, repo, folder);
CREATE INDEX records_outcome ON records
    (outcome, finished_at, id, reason, trigger_index, trigger_type, repo, folder);
CREATE INDEX records_reason ON records
    (reason, finished_at, id, outcome, trigger_index, trigger_type, repo, folder);
CREATE INDEX records_trigger_index ON records
    (trigger_index, finished_at, id, outcome, reason, trigger_type, repo, folder);
CREATE INDEX records_trigger_type ON records
    (trigger_type, finished_at, id, outcome, reason, trigger_index, repo, folder);
CREATE INDEX records_repo ON records
    (repo, finished_at, id, outcome, reason, trigger_index, trigger_type, folder)
    WHERE repo IS NOT NULL;
CREATE INDEX records_folder ON records
    (folder, finished_at, id, outcome, reason, trigger_index, trigger_type, repo)
    WHERE folder IS NOT NULL;
CREATE TABLE counters (
    series TEXT PRIMARY KEY,
    value  REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE records_kept (n INTEGER NOT NULL);
INSERT INTO records_kept (n) VALUES (0);
";

/// Schema 5: where a job may run (`needs`: a JSON array of the labels a worker must carry, or
/// NULL for any worker), its group (jobs of one group run one at a time), the workers that
/// announce themselves (`card` is their JSON, `last_seen` unix milliseconds), and what running
/// jobs show live (a snapshot and the lines of their transcript so far).
const PLACEMENT_V5: &str = "
ALTER TABLE jobs ADD COLUMN needs TEXT;
ALTER TABLE jobs ADD COLUMN group_key TEXT;
CREATE INDEX jobs_group ON jobs (group_key, seq) WHERE state <> 'done' AND group_key IS NOT NULL;
CREATE TABLE workers (
    id        TEXT PRIMARY KEY,
    card      TEXT NOT NULL,
    last_seen INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE live (
    job_id     TEXT PRIMARY KEY,
    snapshot   TEXT NOT NULL,
    lines      INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX live_updated ON live (updated_at);
CREATE TABLE reruns (
    original TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    rerun    TEXT NOT NULL,
    PRIMARY KEY (original, seq)
) WITHOUT ROWID;
CREATE TABLE live_lines (
    job_id TEXT NOT NULL,
    n      INTEGER NOT NULL,
    line   TEXT NOT NULL,
    PRIMARY KEY (job_id, n)
) WITHOUT ROWID;
";

/// Schema 6: each MCP server's pin (what it listed when approved, as the worker writes it) and
/// the drift the last job saw from it, until approved.
const PINS_V6: &str = "
CREATE TABLE pins (
    server    TEXT PRIMARY KEY,
    pin       TEXT NOT NULL,
    pinned_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE pin_drift (
    server  TEXT PRIMARY KEY,
    drift   TEXT NOT NULL,
    seen_at INTEGER NOT NULL
) WITHOUT ROWID;
";

/// The partial indexes keep leasing and listing independent of how many done jobs the file holds.
const INDEXES: &str = "
CREATE INDEX jobs_open ON jobs (seq) WHERE state <> 'done';
CREATE INDEX jobs_done ON jobs (finished_at) WHERE state = 'done';
";

/// From schema 1 (no cancelling): the table made again with the new column and outcome, every
/// row kept, in the transaction that sets the new version.
const MIGRATE_V1: &str = "
ALTER TABLE jobs RENAME TO jobs_v1;
DROP INDEX IF EXISTS jobs_open;
DROP INDEX IF EXISTS jobs_done;
";
const COPY_V1: &str = "
INSERT INTO jobs (seq, id, payload, state, attempt, queued_at, available_at, worker, token,
                  leased_until, finished_at, outcome)
    SELECT seq, id, payload, state, attempt, queued_at, available_at, worker, token,
           leased_until, finished_at, outcome FROM jobs_v1;
DROP TABLE jobs_v1;
";

/// A lapsed lease that has used every attempt becomes lost (run inside each write that looks).
/// So does one marked for cancelling: it is never run again. (A queued job marked for cancelling,
/// by a newer job of its group, became lost when it was marked.)
const SWEEP_LOST: &str = "UPDATE jobs SET state = 'lost', token = NULL, leased_until = NULL
    WHERE state = 'leased' AND leased_until < ?1 AND (attempt >= ?2 OR cancel_requested = 1)";

/// Takes the oldest available job: queued and due, or leased with a lapsed lease and attempts left;
/// needing no label the worker lacks (`?5`, its labels as a JSON array); and the oldest of its
/// group not done.
const TAKE_NEXT: &str = "UPDATE jobs
    SET state = 'leased', attempt = attempt + 1, worker = ?2, leased_at = ?1,
        token = lower(hex(randomblob(16))), leased_until = ?3
    WHERE seq = (
        SELECT j.seq FROM jobs j
        WHERE j.state <> 'done'
          AND ((j.state = 'queued' AND j.available_at <= ?1)
            OR (j.state = 'leased' AND j.leased_until < ?1 AND j.attempt < ?4
                AND j.cancel_requested = 0))
          AND (j.needs IS NULL OR NOT EXISTS (
                SELECT 1 FROM json_each(j.needs) n
                WHERE n.value NOT IN (SELECT w.value FROM json_each(?5) w)))
          AND (j.group_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM jobs o
                WHERE o.group_key = j.group_key AND o.state <> 'done' AND o.seq < j.seq))
        ORDER BY j.seq LIMIT 1)
    RETURNING id, payload, attempt, token, queued_at";

/// Stores a new job (`?1` id, `?2` payload, `?3` now, `?4` needs, `?5` group).
const INSERT_JOB: &str =
    "INSERT INTO jobs (id, payload, state, queued_at, available_at, needs, group_key)
    VALUES (?1, ?2, 'queued', ?3, ?3, ?4, ?5) ON CONFLICT (id) DO NOTHING";

/// Marks the jobs of group `?1` other than `?2` for cancelling: a queued one is lost at once (and
/// reported cancelled), a leased one is stopped by its worker.
const SUPERSEDE: &str = "
UPDATE jobs SET state = 'lost', cancel_requested = 1, token = NULL, leased_until = NULL
    WHERE group_key = ?1 AND id <> ?2 AND state = 'queued';
UPDATE jobs SET cancel_requested = 1
    WHERE group_key = ?1 AND id <> ?2 AND state = 'leased';
";

/// The queue in one SQLite file. Several handles, in one process or several, may share the file:
/// each write is a `BEGIN IMMEDIATE` transaction, in WAL mode, with a busy timeout.
#[derive(Debug)]
pub struct SqliteQueue {
    conn: Mutex<Connection>,
    config: Config,
}

/// An open job as `status` reads its row (`now` tells a job waiting to be retried from a queued one).
fn open_job(row: &rusqlite::Row<'_>, now: i64) -> rusqlite::Result<OpenJob> {
    let state = match row.get::<_, Stored>(1)? {
        Stored::Queued => stored::queued(row.get(4)?, now),
        Stored::Leased => OpenState::Leased {
            worker: row.get::<_, Option<String>>(5)?.unwrap_or_default(),
            until: millis::time(row.get(6)?),
            since: millis::time(row.get::<_, Option<i64>>(9)?.unwrap_or(0)),
        },
        // Done rows are not selected.
        Stored::Lost | Stored::Done => OpenState::Lost,
    };
    Ok(OpenJob {
        id: row.get(0)?,
        state,
        attempt: row.get(2)?,
        queued_at: millis::time(row.get(3)?),
        payload: row.get(7)?,
        cancel_requested: row.get(8)?,
        needs: stored::needs_of(row.get(10)?),
        group: row.get(11)?,
    })
}

/// Stores `job` at `now` inside `tx`; `true` when it is new.
fn insert_job(tx: &Connection, job: &NewJob, now: i64) -> rusqlite::Result<bool> {
    let placement = &job.placement;
    let needs = stored::needs_json(&placement.needs);
    let added = tx.execute(
        INSERT_JOB,
        params![job.id, job.payload, now, needs, placement.group],
    )? == 1;
    if added
        && placement.supersede
        && let Some(group) = &placement.group
    {
        for step in SUPERSEDE.split(';').filter(|s| !s.trim().is_empty()) {
            tx.execute(step, params![group, job.id])?;
        }
    }
    Ok(added)
}

/// Makes the queue's folder (0700) and file (0600) when they are missing: SQLite would make the
/// file 0644, and its -wal and -shm files take the file's mode.
fn create_private(path: &Path) -> Result<(), QueueError> {
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
    Ok(())
}

impl SqliteQueue {
    /// Opens the queue at `path` with the default [`Config`]; see [`SqliteQueue::open_with`].
    pub fn open(path: &Path) -> Result<SqliteQueue, QueueError> {
        SqliteQueue::open_with(path, Config::default())
    }

    /// Opens the queue at `path`, creating its folder (0700) and the file (0600) if missing and
    /// the schema if the file is new, and refusing a file written with a newer schema.
    pub fn open_with(path: &Path, config: Config) -> Result<SqliteQueue, QueueError> {
        create_private(path)?;
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
        let mode = set_wal(&conn).map_err(open_err("set WAL mode"))?;
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
        match known(user_version(&tx).map_err(open_err("read the schema version"))?)? {
            0 => tx
                .execute_batch(&format!(
                    "{JOBS_V2}{INDEXES}{DELIVERIES_V3}{RECORDS_V4}{PLACEMENT_V5}{PINS_V6}"
                ))
                .map_err(open_err("create the schema"))?,
            1 => tx
                .execute_batch(&format!(
                    "{MIGRATE_V1}{JOBS_V2}{COPY_V1}{INDEXES}{DELIVERIES_V3}{RECORDS_V4}{PLACEMENT_V5}{PINS_V6}"
                ))
                .map_err(open_err("migrate the schema from version 1"))?,
            2 => tx
                .execute_batch(&format!("{DELIVERIES_V3}{RECORDS_V4}{PLACEMENT_V5}{PINS_V6}"))
                .map_err(open_err("migrate the schema from version 2"))?,
            3 => tx
                .execute_batch(&format!("{RECORDS_V4}{PLACEMENT_V5}{PINS_V6}"))
                .map_err(open_err("migrate the schema from version 3"))?,
            4 => tx
                .execute_batch(&format!("{PLACEMENT_V5}{PINS_V6}"))
                .map_err(open_err("migrate the schema from version 4"))?,
            5 => tx
                .execute_batch(PINS_V6)
                .map_err(open_err("migrate the schema from version 5"))?,
            _ => {}
        }
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(open_err("set the schema version"))?;
        tx.commit().map_err(open_err("commit the schema"))?;
        Ok(SqliteQueue {
            conn: Mutex::new(conn),
            config: Config {
                max_attempts: config.max_attempts.max(1),
                ..config
            },
        })
    }

    /// The rows of a query of two text columns.
    fn pairs(&self, doing: &'static str, query: &str) -> Result<Vec<(String, String)>, QueueError> {
        let err = sqlite(doing);
        let conn = self.conn();
        let mut stmt = conn.prepare(query).map_err(err)?;
        let rows = stmt
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .map_err(err)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(err)
    }

    /// The connection. A panic while it was held cannot have left a transaction open (a
    /// transaction rolls back when dropped), so a poisoned lock is still a good connection.
    pub(crate) fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Switches the file to WAL. A brand-new file's switch takes a lock SQLite does not wait for under
/// the busy timeout, so several first opens at once (the receiver and the worker starting together)
/// are tried again, with growing pauses, until the busy timeout has passed.
fn set_wal(conn: &Connection) -> rusqlite::Result<String> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(
                    e.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            done => return done,
        }
    }
}

impl Queue for SqliteQueue {
    fn enqueue_job(&self, job: &NewJob, now: SystemTime) -> Result<bool, QueueError> {
        let err = sqlite("enqueue a job");
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let added = insert_job(&tx, job, millis::of(now)).map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(added)
    }

    fn lease_as(
        &self,
        worker: &str,
        labels: &[String],
        lease_for: Duration,
        now: SystemTime,
    ) -> Result<Option<Lease>, QueueError> {
        let err = sqlite("lease a job");
        let until = millis::later(millis::of(now), lease_for);
        let labels = stored::labels_json(labels);
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        tx.execute(
            SWEEP_LOST,
            params![millis::of(now), self.config.max_attempts],
        )
        .map_err(err)?;
        let lease = tx
            .query_row(
                TAKE_NEXT,
                params![
                    millis::of(now),
                    worker,
                    until,
                    self.config.max_attempts,
                    labels
                ],
                |row| {
                    Ok(Lease {
                        job_id: row.get(0)?,
                        payload: row.get(1)?,
                        attempt: row.get(2)?,
                        token: row.get(3)?,
                        until: millis::time(until),
                        queued_at: millis::time(row.get(4)?),
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
                params![
                    lease.job_id,
                    lease.token,
                    millis::later(millis::of(now), lease_for)
                ],
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
                params![lease.job_id, lease.token, millis::of(now)],
            )
            .map_err(sqlite("finish a job"))?;
        Ok(changed == 1)
    }

    fn retry(&self, lease: &Lease, now: SystemTime) -> Result<RetryDecision, QueueError> {
        let err = sqlite("retry a job");
        let now = millis::of(now);
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
                let available_at = millis::later(now, self.config.backoff.after(attempt));
                tx.execute(
                    "UPDATE jobs SET state = 'queued', available_at = ?2,
                         worker = NULL, token = NULL, leased_until = NULL
                     WHERE id = ?1",
                    params![lease.job_id, available_at],
                )
                .map_err(err)?;
                RetryDecision::Requeued {
                    available_at: millis::time(available_at),
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
        let now = millis::of(now);
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
                    "SELECT id, payload, attempt, cancel_requested FROM jobs
                     WHERE state <> 'done' AND state = 'lost' ORDER BY seq",
                )
                .map_err(err)?;
            let rows = stmt
                .query_map([], |row| {
                    Ok(LostJob {
                        job_id: row.get(0)?,
                        payload: row.get(1)?,
                        attempt: row.get(2)?,
                        cancelled: row.get(3)?,
                    })
                })
                .map_err(err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(err)?
        };
        tx.execute(
            "UPDATE jobs SET state = 'done', finished_at = ?1, payload = '',
                 outcome = CASE cancel_requested WHEN 1 THEN 'cancelled' ELSE 'lost' END
             WHERE state = 'lost'",
            params![now],
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(lost)
    }

    fn status(&self, now: SystemTime, recent_done: usize) -> Result<Status, QueueError> {
        let err = sqlite("read the queue's status");
        let now = millis::of(now);
        let mut conn = self.conn();
        // One read transaction: the three reads see the same moment.
        let tx = conn.transaction().map_err(err)?;
        let open = {
            let mut stmt = tx
                .prepare(
                    "SELECT id, state, attempt, queued_at, available_at, worker, leased_until,
                            payload, cancel_requested, leased_at, needs, group_key
                     FROM jobs WHERE state <> 'done' ORDER BY seq",
                )
                .map_err(err)?;
            let rows = stmt.query_map([], |row| open_job(row, now)).map_err(err)?;
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
                        finished_at: millis::time(row.get(2)?),
                        end: row.get(3)?,
                    })
                })
                .map_err(err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(err)?
        };
        tx.commit().map_err(err)?;
        Ok(Status::new(
            open,
            usize::try_from(done).unwrap_or(usize::MAX),
            recent,
        ))
    }

    fn enqueue_delivery(
        &self,
        key: &str,
        jobs: &[NewJob],
        now: SystemTime,
    ) -> Result<bool, QueueError> {
        let now = millis::of(now);
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite("begin a delivery"))?;
        let new = tx
            .execute(
                "INSERT INTO deliveries (key, seen_at) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
                params![key, now],
            )
            .map_err(sqlite("remember a delivery"))?
            == 1;
        if new {
            for job in jobs {
                insert_job(&tx, job, now).map_err(sqlite("enqueue a delivery's job"))?;
            }
        }
        tx.commit().map_err(sqlite("commit a delivery"))?;
        Ok(new)
    }

    fn prune_done(&self, before: SystemTime) -> Result<usize, QueueError> {
        let before = millis::of(before);
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite("begin pruning"))?;
        let jobs = tx
            .execute(
                "DELETE FROM jobs WHERE state = 'done' AND finished_at < ?1",
                params![before],
            )
            .map_err(sqlite("prune done jobs"))?;
        tx.execute("DELETE FROM deliveries WHERE seen_at < ?1", params![before])
            .map_err(sqlite("prune deliveries"))?;
        tx.commit().map_err(sqlite("commit pruning"))?;
        Ok(jobs)
    }

    fn cancel(&self, id: &str, now: SystemTime) -> Result<Cancel, QueueError> {
        let err = sqlite("cancel a job");
        let now = millis::of(now);
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let row: Option<CancelRow> = tx
            .query_row(
                "SELECT state, payload, attempt, leased_until, worker FROM jobs WHERE id = ?1",
                params![id],
                |row| {
                    Ok((
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        row.get(4)?,
                    ))
                },
            )
            .optional()
            .map_err(err)?;
        let answer = match row {
            None => Cancel::Unknown,
            Some((Stored::Done, ..)) => Cancel::AlreadyDone,
            Some((Stored::Leased, _, _, Some(until), worker)) if until >= now => {
                tx.execute(
                    "UPDATE jobs SET cancel_requested = 1 WHERE id = ?1",
                    params![id],
                )
                .map_err(err)?;
                Cancel::Stopping {
                    worker: worker.unwrap_or_default(),
                }
            }
            // Queued, waiting, lost, or leased by a worker whose lease lapsed: nobody runs it.
            Some((_, payload, attempt, ..)) => {
                tx.execute(
                    "UPDATE jobs SET state = 'done', outcome = 'cancelled', finished_at = ?2,
                         payload = '', token = NULL, leased_until = NULL, cancel_requested = 1
                     WHERE id = ?1",
                    params![id, now],
                )
                .map_err(err)?;
                Cancel::Removed { payload, attempt }
            }
        };
        tx.commit().map_err(err)?;
        Ok(answer)
    }

    fn lease_state(&self, lease: &Lease) -> Result<LeaseState, QueueError> {
        let held: Option<bool> = self
            .conn()
            .query_row(
                "SELECT cancel_requested FROM jobs
                 WHERE id = ?1 AND token = ?2 AND state = 'leased'",
                params![lease.job_id, lease.token],
                |row| row.get(0),
            )
            .optional()
            .map_err(sqlite("read a job's cancel mark"))?;
        Ok(match held {
            None => LeaseState::Lost,
            Some(true) => LeaseState::CancelRequested,
            Some(false) => LeaseState::Held,
        })
    }

    fn announce(&self, card: &WorkerCard, now: SystemTime) -> Result<(), QueueError> {
        let err = sqlite("announce a worker");
        let text = stored::card_text(card)?;
        let forget_before = millis::forget_before(now);
        let now = millis::of(now);
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        tx.execute(
            "INSERT INTO workers (id, card, last_seen) VALUES (?1, ?2, ?3)
             ON CONFLICT (id) DO UPDATE SET card = excluded.card, last_seen = excluded.last_seen",
            params![card.id, text, now],
        )
        .map_err(err)?;
        tx.execute(
            "DELETE FROM workers WHERE last_seen < ?1",
            params![forget_before],
        )
        .map_err(err)?;
        tx.commit().map_err(err)
    }

    fn workers(&self) -> Result<Vec<WorkerSeen>, QueueError> {
        let err = sqlite("list the workers");
        let conn = self.conn();
        let mut stmt = conn
            .prepare("SELECT card, last_seen FROM workers ORDER BY id")
            .map_err(err)?;
        let rows = stmt
            .query_map([], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
            })
            .map_err(err)?;
        let mut seen = Vec::new();
        for row in rows {
            let (card, last_seen) = row.map_err(err)?;
            seen.extend(stored::worker_seen(&card, last_seen));
        }
        Ok(seen)
    }

    fn leave(&self, id: &str) -> Result<(), QueueError> {
        self.conn()
            .execute("DELETE FROM workers WHERE id = ?1", params![id])
            .map_err(sqlite("forget a worker"))?;
        Ok(())
    }

    fn live_put(
        &self,
        job_id: &str,
        snapshot: &str,
        lines: &[String],
        now: SystemTime,
    ) -> Result<(), QueueError> {
        let err = sqlite("store a job's live view");
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let stored: i64 = tx
            .query_row(
                "SELECT lines FROM live WHERE job_id = ?1",
                params![job_id],
                |row| row.get(0),
            )
            .optional()
            .map_err(err)?
            .unwrap_or(0);
        for (n, line) in (stored..).zip(lines) {
            tx.execute(
                "INSERT OR REPLACE INTO live_lines (job_id, n, line) VALUES (?1, ?2, ?3)",
                params![job_id, n, line],
            )
            .map_err(err)?;
        }
        let total = stored + i64::try_from(lines.len()).unwrap_or(i64::MAX);
        tx.execute(
            "INSERT INTO live (job_id, snapshot, lines, updated_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (job_id) DO UPDATE SET snapshot = excluded.snapshot,
                 lines = excluded.lines, updated_at = excluded.updated_at",
            params![job_id, snapshot, total, millis::of(now)],
        )
        .map_err(err)?;
        tx.commit().map_err(err)
    }

    fn live_get(
        &self,
        job_id: &str,
        from: u64,
        max: usize,
    ) -> Result<Option<LiveView>, QueueError> {
        let err = sqlite("read a job's live view");
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(err)?;
        let head: Option<(String, i64, i64)> = tx
            .query_row(
                "SELECT snapshot, lines, updated_at FROM live WHERE job_id = ?1",
                params![job_id],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .optional()
            .map_err(err)?;
        let Some((snapshot, total, updated)) = head else {
            return Ok(None);
        };
        let lines = {
            let mut stmt = tx
                .prepare(
                    "SELECT line FROM live_lines WHERE job_id = ?1 AND n >= ?2 ORDER BY n LIMIT ?3",
                )
                .map_err(err)?;
            let from = i64::try_from(from).unwrap_or(i64::MAX);
            let max = i64::try_from(max).unwrap_or(i64::MAX);
            let rows = stmt
                .query_map(params![job_id, from, max], |row| row.get(0))
                .map_err(err)?;
            rows.collect::<Result<Vec<String>, _>>().map_err(err)?
        };
        tx.commit().map_err(err)?;
        Ok(Some(LiveView {
            snapshot,
            lines,
            total: u64::try_from(total).unwrap_or(0),
            updated: millis::time(updated),
        }))
    }

    fn live_prune(&self, before: SystemTime) -> Result<usize, QueueError> {
        let err = sqlite("prune live views");
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let before = millis::of(before);
        tx.execute(
            "DELETE FROM live_lines WHERE job_id IN
                 (SELECT job_id FROM live WHERE updated_at < ?1)",
            params![before],
        )
        .map_err(err)?;
        let gone = tx
            .execute("DELETE FROM live WHERE updated_at < ?1", params![before])
            .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(gone)
    }

    fn link_rerun(&self, original: &str, rerun: &str) -> Result<(), QueueError> {
        self.conn()
            .execute(
                "INSERT INTO reruns (original, seq, rerun)
                 SELECT ?1, coalesce(max(seq), 0) + 1, ?2 FROM reruns WHERE original = ?1",
                params![original, rerun],
            )
            .map_err(sqlite("link a rerun"))?;
        Ok(())
    }

    fn reruns(&self, original: &str) -> Result<Vec<String>, QueueError> {
        let err = sqlite("read the reruns of a job");
        let conn = self.conn();
        let mut stmt = conn
            .prepare("SELECT rerun FROM reruns WHERE original = ?1 ORDER BY seq")
            .map_err(err)?;
        let rows = stmt
            .query_map(params![original], |row| row.get(0))
            .map_err(err)?;
        rows.collect::<Result<Vec<String>, _>>().map_err(err)
    }

    fn pin(&self, server: &str) -> Result<Option<String>, QueueError> {
        self.conn()
            .query_row(
                "SELECT pin FROM pins WHERE server = ?1",
                params![server],
                |row| row.get(0),
            )
            .optional()
            .map_err(sqlite("read a server's pin"))
    }

    fn pins(&self) -> Result<Vec<(String, String)>, QueueError> {
        self.pairs(
            "read the pins",
            "SELECT server, pin FROM pins ORDER BY server",
        )
    }

    fn put_pin(
        &self,
        server: &str,
        pin: &str,
        first: bool,
        now: SystemTime,
    ) -> Result<bool, QueueError> {
        let err = sqlite("store a server's pin");
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let verb = if first {
            "INSERT OR IGNORE"
        } else {
            "INSERT OR REPLACE"
        };
        let stored = tx
            .execute(
                &format!("{verb} INTO pins (server, pin, pinned_at) VALUES (?1, ?2, ?3)"),
                params![server, pin, millis::of(now)],
            )
            .map_err(err)?
            == 1;
        if stored {
            tx.execute("DELETE FROM pin_drift WHERE server = ?1", params![server])
                .map_err(err)?;
        }
        tx.commit().map_err(err)?;
        Ok(stored)
    }

    fn put_pin_drift(&self, server: &str, drift: &str, now: SystemTime) -> Result<(), QueueError> {
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO pin_drift (server, drift, seen_at) VALUES (?1, ?2, ?3)",
                params![server, drift, millis::of(now)],
            )
            .map_err(sqlite("note a server's drift from its pin"))?;
        Ok(())
    }

    fn pin_drifts(&self) -> Result<Vec<(String, String)>, QueueError> {
        self.pairs(
            "read the drift from pins",
            "SELECT server, drift FROM pin_drift ORDER BY server",
        )
    }

    fn release(&self, lease: &Lease, now: SystemTime) -> Result<bool, QueueError> {
        let changed = self
            .conn()
            .execute(
                "UPDATE jobs SET state = 'queued', available_at = ?3, attempt = max(attempt - 1, 0),
                     worker = NULL, token = NULL, leased_until = NULL
                 WHERE id = ?1 AND token = ?2 AND state = 'leased'",
                params![lease.job_id, lease.token, millis::of(now)],
            )
            .map_err(sqlite("hand a job back"))?;
        Ok(changed == 1)
    }
}

/// What cancelling reads of a job: its state, payload, attempt, lease end and worker.
type CancelRow = (Stored, String, u32, Option<i64>, Option<String>);

impl FromSql for Stored {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Stored> {
        Stored::named(value.as_str()?).ok_or(FromSqlError::InvalidType)
    }
}

impl FromSql for End {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<End> {
        End::named(value.as_str()?).ok_or(FromSqlError::InvalidType)
    }
}

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

pub(crate) fn sqlite(op: &'static str) -> impl Fn(rusqlite::Error) -> QueueError + Copy {
    move |source| QueueError::Sqlite { op, source }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
