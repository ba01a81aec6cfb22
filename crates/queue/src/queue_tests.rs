#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::sync::{Arc, Barrier};
use std::time::UNIX_EPOCH;

use super::*;
use crate::Backoff;
use crate::shared_tests::jobs;

/// A long lease: nothing lapses unless a test moves the clock past it.
const LONG: Duration = Duration::from_secs(3600);

/// The test clock: `ms` milliseconds after a fixed start.
fn t(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms)
}

fn fresh() -> (tempfile::TempDir, SqliteQueue) {
    let dir = tempfile::tempdir().unwrap();
    let queue = SqliteQueue::open(&dir.path().join("queue.sqlite3")).unwrap();
    (dir, queue)
}

#[test]
fn backoff_doubles_up_to_its_cap() {
    let backoff = Backoff::default();
    let secs = |attempt| backoff.after(attempt).as_secs();
    assert_eq!(
        [secs(1), secs(2), secs(3), secs(7), secs(40)],
        [5, 10, 20, 300, 300]
    );
}

#[test]
fn a_newer_schema_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.sqlite3");
    drop(SqliteQueue::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(conn);
    let err = SqliteQueue::open(&path).unwrap_err();
    assert!(
        matches!(err, QueueError::UnknownSchema { found, .. } if found == SCHEMA_VERSION + 1),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&format!("schema version {}", SCHEMA_VERSION + 1)),
        "{message}"
    );
    assert!(message.contains("queue.sqlite3"), "{message}");
    // Refused without a change.
    let conn = Connection::open(&path).unwrap();
    assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION + 1);
}

#[test]
fn a_new_file_gets_the_schema_version() {
    let (dir, queue) = fresh();
    drop(queue);
    let conn = Connection::open(dir.path().join("queue.sqlite3")).unwrap();
    assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn a_file_that_is_not_a_queue_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.sqlite3");
    std::fs::write(
        &path,
        "not a database, but long enough to have a header of sorts......",
    )
    .unwrap();
    let err = SqliteQueue::open(&path).unwrap_err();
    assert!(matches!(err, QueueError::Open { .. }), "{err:?}");
}

#[test]
fn open_creates_the_folder_and_a_private_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deployment/state/queue.sqlite3");
    let queue = SqliteQueue::open(&path).unwrap();
    queue.enqueue("a", "{}", t(0)).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(
        mode(&dir.path().join("deployment/state/queue.sqlite3-wal")),
        0o600
    );
    assert_eq!(mode(&dir.path().join("deployment/state")), 0o700);
}

#[test]
fn a_done_job_keeps_no_payload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.sqlite3");
    let queue = SqliteQueue::open(&path).unwrap();
    queue.enqueue("a", "{\"secret-ish\":1}", t(0)).unwrap();
    let lease = queue.lease("w", LONG, t(0)).unwrap().unwrap();
    queue.finish(&lease, t(1)).unwrap();
    let payload: String = queue
        .conn()
        .query_row("SELECT payload FROM jobs WHERE id = 'a'", [], |row| {
            row.get(0)
        })
        .unwrap();
    assert_eq!(payload, "");
}

#[test]
fn leasing_reads_only_open_jobs() {
    let (_dir, queue) = fresh();
    let conn = queue.conn();
    let plan: Vec<String> = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {TAKE_NEXT}"))
        .unwrap()
        .query_map(params![0, "w", 0, 2, "[]"], |row| row.get(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        plan.iter().any(|step| step.contains("jobs_open")),
        "the lease does not use the open-jobs index: {plan:?}"
    );
    assert!(
        !plan
            .iter()
            .any(|step| step.starts_with("SCAN jobs") && !step.contains("INDEX")),
        "the lease scans the whole table: {plan:?}"
    );
}

#[test]
fn a_schema_1_file_is_migrated_with_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.sqlite3");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE jobs (
                seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
                payload TEXT NOT NULL,
                state TEXT NOT NULL CHECK (state IN ('queued', 'leased', 'lost', 'done')),
                attempt INTEGER NOT NULL DEFAULT 0, queued_at INTEGER NOT NULL,
                available_at INTEGER NOT NULL, worker TEXT, token TEXT, leased_until INTEGER,
                finished_at INTEGER,
                outcome TEXT CHECK (outcome IN ('finished', 'exhausted', 'lost')));
             INSERT INTO jobs (id, payload, state, queued_at, available_at)
                 VALUES ('old', '{\"p\":1}', 'queued', 1, 1);
             INSERT INTO jobs (id, payload, state, attempt, queued_at, available_at, finished_at, outcome)
                 VALUES ('done', '', 'done', 1, 1, 1, 2, 'finished');
             PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let queue = SqliteQueue::open(&path).unwrap();
    let status = queue.status(t(0), 5).unwrap();
    assert_eq!(status.open.len(), 1);
    assert_eq!(status.open[0].payload, "{\"p\":1}");
    assert_eq!(status.counts.done, 1);
    // The done id is still refused, and a new job goes after the old one.
    assert!(!queue.enqueue("done", "{}", t(1)).unwrap());
    queue.enqueue("new", "{}", t(1)).unwrap();
    assert_eq!(queue.lease("w", LONG, t(2)).unwrap().unwrap().job_id, "old");
    assert!(matches!(
        queue.cancel("new", t(3)).unwrap(),
        Cancel::Removed { .. }
    ));
    drop(queue);
    // Opening again changes nothing.
    let queue = SqliteQueue::open(&path).unwrap();
    assert_eq!(queue.status(t(4), 0).unwrap().counts.done, 2);
}

#[test]
fn a_schema_2_file_gets_the_deliveries_and_keeps_its_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.sqlite3");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "{JOBS_V2}{INDEXES}
             INSERT INTO jobs (id, payload, state, queued_at, available_at)
                 VALUES ('old', '{{}}', 'queued', 1, 1);
             PRAGMA user_version = 2;"
        ))
        .unwrap();
    }
    let queue = SqliteQueue::open(&path).unwrap();
    assert_eq!(queue.status(t(0), 0).unwrap().open.len(), 1);
    assert!(
        queue
            .enqueue_delivery("github:x", &jobs(&["n"]), t(0))
            .unwrap()
    );
    assert!(!queue.enqueue_delivery("github:x", &[], t(1)).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
}

#[test]
fn a_schema_5_file_gets_the_pins_and_keeps_its_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.sqlite3");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "{JOBS_V2}{INDEXES}{DELIVERIES_V3}{RECORDS_V4}{PLACEMENT_V5}
             INSERT INTO jobs (id, payload, state, queued_at, available_at)
                 VALUES ('old', '{{}}', 'queued', 1, 1);
             PRAGMA user_version = 5;"
        ))
        .unwrap();
    }
    let queue = SqliteQueue::open(&path).unwrap();
    assert_eq!(queue.status(t(0), 0).unwrap().open.len(), 1);
    assert!(queue.put_pin("docs", "v1", true, t(0)).unwrap());
    assert_eq!(queue.pin("docs").unwrap().as_deref(), Some("v1"));
    let conn = rusqlite::Connection::open(&path).unwrap();
    assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
}

#[test]
fn a_schema_3_file_gets_the_records_index_and_keeps_its_jobs_and_deliveries() {
    use crate::records::{RecordEntry, RecordFilter, RecordIndex, RecordKeys};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.sqlite3");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "{JOBS_V2}{INDEXES}{DELIVERIES_V3}
             INSERT INTO jobs (id, payload, state, queued_at, available_at)
                 VALUES ('old', '{{}}', 'queued', 1, 1);
             INSERT INTO deliveries (key, seen_at) VALUES ('github:seen', 1);
             PRAGMA user_version = 3;"
        ))
        .unwrap();
    }
    let queue = SqliteQueue::open(&path).unwrap();
    assert_eq!(queue.status(t(0), 0).unwrap().open.len(), 1);
    assert!(!queue.enqueue_delivery("github:seen", &[], t(1)).unwrap());
    let keys = RecordKeys {
        finished_at_ms: 1,
        outcome: "completed".into(),
        reason: None,
        trigger_index: None,
        trigger_type: "cli".into(),
        repo: None,
        folder: None,
    };
    let entry = RecordEntry {
        id: "r",
        text: "{}",
        keys: &keys,
        counts: &[],
    };
    assert!(queue.put_record(&entry).unwrap());
    let found = queue
        .find_records(&RecordFilter::default(), None, 5)
        .unwrap();
    assert_eq!(found.len(), 1);
    let conn = rusqlite::Connection::open(&path).unwrap();
    assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
}

#[test]
fn a_schema_4_file_gets_placement_and_workers_and_keeps_its_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.sqlite3");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "{JOBS_V2}{INDEXES}{DELIVERIES_V3}{RECORDS_V4}
             INSERT INTO jobs (id, payload, state, queued_at, available_at)
                 VALUES ('old', '{{}}', 'queued', 1, 1);
             PRAGMA user_version = 4;"
        ))
        .unwrap();
    }
    let queue = SqliteQueue::open(&path).unwrap();
    let open = queue.status(t(0), 0).unwrap().open;
    assert_eq!((open.len(), open[0].needs.len()), (1, 0));
    // An old job needs nothing: a worker with labels takes it.
    let lease = queue
        .lease_as("w", &["gpu".to_owned()], LONG, t(0))
        .unwrap()
        .unwrap();
    assert_eq!(lease.job_id, "old");
    assert!(queue.workers().unwrap().is_empty());
    let conn = rusqlite::Connection::open(&path).unwrap();
    assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
}

#[test]
fn many_first_opens_of_a_new_file_at_once_all_succeed() {
    // The receiver and the worker starting together on a fresh state folder: each open of the
    // brand-new file switches it to WAL, which takes a lock the others must wait for.
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/queue.sqlite3");
        let barrier = Arc::new(Barrier::new(6));
        let handles: Vec<_> = (0..6)
            .map(|_| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    SqliteQueue::open(&path).map(|_| ())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    }
}
