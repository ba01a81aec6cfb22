#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use std::sync::{Arc, Barrier};

use super::*;
use crate::{Backoff, LeaseState, MAX_ATTEMPTS};

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

fn fresh_with(config: Config) -> (tempfile::TempDir, SqliteQueue) {
    let dir = tempfile::tempdir().unwrap();
    let queue = SqliteQueue::open_with(&dir.path().join("queue.sqlite3"), config).unwrap();
    (dir, queue)
}

fn leased_ids(queue: &dyn Queue, now: SystemTime) -> Vec<String> {
    std::iter::from_fn(|| queue.lease("w", LONG, now).unwrap())
        .map(|lease| lease.job_id)
        .collect()
}

#[test]
fn jobs_are_leased_in_enqueue_order() {
    let (_dir, queue) = fresh();
    // Enqueue order decides, not the id or the clock.
    assert!(queue.enqueue("c", "{\"n\":1}", t(0)).unwrap());
    assert!(queue.enqueue("a", "{\"n\":2}", t(0)).unwrap());
    assert!(queue.enqueue("b", "{\"n\":3}", t(0)).unwrap());
    let first = queue.lease("w", LONG, t(1)).unwrap().unwrap();
    assert_eq!(
        (&*first.job_id, &*first.payload, first.attempt),
        ("c", "{\"n\":1}", 1)
    );
    assert_eq!(first.until, t(1) + LONG);
    assert_eq!(first.queued_at, t(0));
    assert_eq!(leased_ids(&queue, t(1)), ["a", "b"]);
}

#[test]
fn an_empty_queue_leases_nothing_and_a_new_job_is_available_at_once() {
    let (_dir, queue) = fresh();
    assert_eq!(queue.lease("w", LONG, t(0)).unwrap(), None);
    queue.enqueue("a", "{}", t(5)).unwrap();
    assert_eq!(queue.status(t(5), 0).unwrap().counts.queued, 1);
    assert_eq!(leased_ids(&queue, t(5)), ["a"]);
}

#[test]
fn a_duplicate_id_is_not_added() {
    let (_dir, queue) = fresh();
    assert!(queue.enqueue("dup", "{\"first\":true}", t(0)).unwrap());
    assert!(!queue.enqueue("dup", "{\"second\":true}", t(1)).unwrap());
    let lease = queue.lease("w", LONG, t(2)).unwrap().unwrap();
    assert_eq!(lease.payload, "{\"first\":true}");
    assert_eq!(queue.lease("w", LONG, t(2)).unwrap(), None);
    // Still refused once the job is done.
    assert!(queue.finish(&lease, t(3)).unwrap());
    assert!(!queue.enqueue("dup", "{}", t(4)).unwrap());
    assert_eq!(queue.lease("w", LONG, t(5)).unwrap(), None);
}

#[test]
fn two_handles_on_one_file_never_hold_the_same_job() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.sqlite3");
    let one = SqliteQueue::open(&path).unwrap();
    let two = SqliteQueue::open(&path).unwrap();
    one.enqueue("a", "{}", t(0)).unwrap();
    two.enqueue("b", "{}", t(0)).unwrap();
    let a = one.lease("one", LONG, t(1)).unwrap().unwrap();
    let b = two.lease("two", LONG, t(1)).unwrap().unwrap();
    assert_eq!((&*a.job_id, &*b.job_id), ("a", "b"));
    assert_eq!(two.lease("two", LONG, t(2)).unwrap(), None);
    assert_eq!(one.lease("one", LONG, t(2)).unwrap(), None);
    // Each handle sees the other's lease.
    assert!(two.finish(&a, t(3)).unwrap());
    assert!(one.finish(&b, t(3)).unwrap());
    assert_eq!(one.status(t(4), 10).unwrap().counts.done, 2);
}

#[test]
fn concurrent_workers_lease_every_job_exactly_once() {
    const JOBS: usize = 200;
    const WORKERS: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.sqlite3");
    let queue = SqliteQueue::open(&path).unwrap();
    for i in 0..JOBS {
        assert!(queue.enqueue(&format!("job-{i}"), "{}", t(0)).unwrap());
    }
    let start = Arc::new(Barrier::new(WORKERS));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let path = path.clone();
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                let queue = SqliteQueue::open(&path).unwrap();
                let mut leased = Vec::new();
                start.wait();
                while let Some(lease) = queue.lease(&format!("w{w}"), LONG, t(1)).unwrap() {
                    assert_eq!(lease.attempt, 1);
                    assert!(queue.finish(&lease, t(2)).unwrap());
                    leased.push(lease.job_id);
                }
                leased
            })
        })
        .collect();
    let mut times: HashMap<String, usize> = HashMap::new();
    for worker in workers {
        for id in worker.join().unwrap() {
            *times.entry(id).or_default() += 1;
        }
    }
    assert_eq!(times.len(), JOBS, "some jobs were never leased");
    let twice: Vec<_> = times.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "leased more than once: {twice:?}");
    let status = queue.status(t(3), 0).unwrap();
    assert!(status.open.is_empty());
    assert_eq!(status.counts.done, JOBS);
}

#[test]
fn the_queue_is_shared_as_a_trait_object() {
    let (_dir, queue) = fresh();
    let queue: Arc<dyn Queue> = Arc::new(queue);
    queue.enqueue("a", "{}", t(0)).unwrap();
    let other = Arc::clone(&queue);
    let lease = std::thread::spawn(move || other.lease("w", LONG, t(1)).unwrap())
        .join()
        .unwrap()
        .unwrap();
    assert!(queue.finish(&lease, t(2)).unwrap());
}

#[test]
fn a_lapsed_lease_is_leased_again_with_attempt_2() {
    let (_dir, queue) = fresh();
    queue.enqueue("a", "{\"p\":1}", t(0)).unwrap();
    let first = queue
        .lease("dead", Duration::from_millis(1000), t(0))
        .unwrap()
        .unwrap();
    // Held up to and including its last millisecond.
    assert_eq!(queue.lease("w", LONG, t(1000)).unwrap(), None);
    let second = queue.lease("w", LONG, t(1001)).unwrap().unwrap();
    assert_eq!(second.job_id, "a");
    assert_eq!(second.payload, "{\"p\":1}");
    assert_eq!((first.attempt, second.attempt), (1, 2));
    assert_ne!(first.token, second.token);
}

#[test]
fn a_lapsed_last_attempt_is_lost_and_reported_once() {
    let (_dir, queue) = fresh();
    queue.enqueue("a", "{\"p\":1}", t(0)).unwrap();
    let short = Duration::from_millis(100);
    queue.lease("dead-1", short, t(0)).unwrap().unwrap();
    let second = queue.lease("dead-2", short, t(200)).unwrap().unwrap();
    assert_eq!(second.attempt, MAX_ATTEMPTS);
    // Nothing is reported while the last lease holds.
    assert_eq!(queue.take_lost(t(300)).unwrap(), []);
    // Lapsed on its last attempt: not leased again.
    assert_eq!(queue.lease("w", LONG, t(400)).unwrap(), None);
    let status = queue.status(t(400), 10).unwrap();
    assert_eq!(status.open[0].state, OpenState::Lost);
    assert_eq!(status.counts.lost, 1);
    let lost = queue.take_lost(t(500)).unwrap();
    assert_eq!(
        lost,
        [LostJob {
            job_id: "a".to_owned(),
            payload: "{\"p\":1}".to_owned(),
            attempt: 2,
            cancelled: false,
        }]
    );
    assert_eq!(queue.take_lost(t(600)).unwrap(), []);
    assert_eq!(queue.lease("w", LONG, t(700)).unwrap(), None);
    let status = queue.status(t(700), 10).unwrap();
    assert!(status.open.is_empty());
    assert_eq!(status.recent_done[0].end, End::Lost);
    assert_eq!(status.recent_done[0].finished_at, t(500));
    // The dead worker's lease is gone for good.
    assert!(!queue.finish(&second, t(800)).unwrap());
}

#[test]
fn take_lost_settles_a_lapsed_last_attempt_by_itself() {
    let (_dir, queue) = fresh_with(Config {
        max_attempts: 1,
        ..Config::default()
    });
    queue.enqueue("a", "{}", t(0)).unwrap();
    queue.enqueue("b", "{}", t(0)).unwrap();
    queue
        .lease("dead", Duration::from_millis(10), t(0))
        .unwrap()
        .unwrap();
    let lost = queue.take_lost(t(11)).unwrap();
    assert_eq!(lost.len(), 1);
    assert_eq!((&*lost[0].job_id, lost[0].attempt), ("a", 1));
    assert_eq!(leased_ids(&queue, t(12)), ["b"]);
}

#[test]
fn a_stale_lease_cannot_renew_finish_or_retry() {
    let (_dir, queue) = fresh();
    queue.enqueue("a", "{}", t(0)).unwrap();
    let stale = queue
        .lease("slow", Duration::from_millis(100), t(0))
        .unwrap()
        .unwrap();
    let current = queue.lease("w", LONG, t(101)).unwrap().unwrap();
    assert!(!queue.renew(&stale, LONG, t(102)).unwrap());
    assert!(!queue.finish(&stale, t(102)).unwrap());
    assert_eq!(queue.retry(&stale, t(102)).unwrap(), RetryDecision::NotHeld);
    // The current lease is untouched by any of that.
    let status = queue.status(t(103), 0).unwrap();
    assert_eq!(
        status.open[0].state,
        OpenState::Leased {
            worker: "w".to_owned(),
            until: t(101) + LONG,
            since: t(101),
        }
    );
    assert!(queue.renew(&current, LONG, t(103)).unwrap());
    assert!(queue.finish(&current, t(104)).unwrap());
    // Once done, no lease of the job is held.
    assert!(!queue.finish(&current, t(105)).unwrap());
    assert!(!queue.renew(&current, LONG, t(105)).unwrap());
    assert_eq!(
        queue.retry(&current, t(105)).unwrap(),
        RetryDecision::NotHeld
    );
}

#[test]
fn renew_keeps_a_job_from_lapsing() {
    let (_dir, queue) = fresh();
    queue.enqueue("a", "{}", t(0)).unwrap();
    let second = Duration::from_millis(1000);
    let lease = queue.lease("w", second, t(0)).unwrap().unwrap();
    assert!(queue.renew(&lease, second, t(900)).unwrap());
    assert_eq!(queue.lease("other", LONG, t(1500)).unwrap(), None);
    assert_eq!(queue.lease("other", LONG, t(1900)).unwrap(), None);
    let next = queue.lease("other", LONG, t(1901)).unwrap().unwrap();
    assert_eq!(next.attempt, 2);
}

#[test]
fn a_retried_job_waits_out_its_backoff() {
    let (_dir, queue) = fresh_with(Config {
        max_attempts: 3,
        backoff: Backoff {
            first: Duration::from_millis(100),
            cap: Duration::from_secs(60),
        },
    });
    queue.enqueue("a", "{}", t(0)).unwrap();
    let first = queue.lease("w", LONG, t(0)).unwrap().unwrap();
    assert_eq!(
        queue.retry(&first, t(10)).unwrap(),
        RetryDecision::Requeued {
            available_at: t(110)
        }
    );
    // The lease that was retried is no longer held.
    assert!(!queue.finish(&first, t(11)).unwrap());
    let status = queue.status(t(109), 0).unwrap();
    assert_eq!(status.open[0].state, OpenState::Waiting { until: t(110) });
    assert_eq!(status.counts.waiting, 1);
    assert_eq!(queue.lease("w", LONG, t(109)).unwrap(), None);
    assert_eq!(queue.status(t(110), 0).unwrap().counts.queued, 1);
    let second = queue.lease("w", LONG, t(110)).unwrap().unwrap();
    assert_eq!(second.attempt, 2);
    // The second wait is twice the first.
    assert_eq!(
        queue.retry(&second, t(200)).unwrap(),
        RetryDecision::Requeued {
            available_at: t(400)
        }
    );
    assert_eq!(queue.lease("w", LONG, t(399)).unwrap(), None);
    assert_eq!(queue.lease("w", LONG, t(400)).unwrap().unwrap().attempt, 3);
}

#[test]
fn a_retried_job_keeps_its_place_in_line() {
    let (_dir, queue) = fresh_with(Config {
        backoff: Backoff {
            first: Duration::from_millis(100),
            cap: Duration::from_millis(100),
        },
        ..Config::default()
    });
    queue.enqueue("old", "{}", t(0)).unwrap();
    let lease = queue.lease("w", LONG, t(0)).unwrap().unwrap();
    queue.enqueue("new", "{}", t(1)).unwrap();
    queue.retry(&lease, t(2)).unwrap();
    assert_eq!(leased_ids(&queue, t(1000)), ["old", "new"]);
}

#[test]
fn a_retry_on_the_last_attempt_is_exhausted() {
    let (_dir, queue) = fresh_with(Config {
        backoff: Backoff {
            first: Duration::from_millis(100),
            cap: Duration::from_millis(100),
        },
        ..Config::default()
    });
    queue.enqueue("a", "{}", t(0)).unwrap();
    let first = queue.lease("w", LONG, t(0)).unwrap().unwrap();
    assert!(matches!(
        queue.retry(&first, t(1)).unwrap(),
        RetryDecision::Requeued { .. }
    ));
    let last = queue.lease("w", LONG, t(200)).unwrap().unwrap();
    assert_eq!(last.attempt, MAX_ATTEMPTS);
    assert_eq!(
        queue.retry(&last, t(201)).unwrap(),
        RetryDecision::Exhausted
    );
    assert_eq!(queue.lease("w", LONG, t(10_000)).unwrap(), None);
    assert_eq!(queue.take_lost(t(10_000)).unwrap(), []);
    let status = queue.status(t(10_000), 10).unwrap();
    assert!(status.open.is_empty());
    assert_eq!(
        status.recent_done,
        [DoneJob {
            id: "a".to_owned(),
            attempt: 2,
            finished_at: t(201),
            end: End::Exhausted,
        }]
    );
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
fn the_queue_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.sqlite3");
    let queue = SqliteQueue::open(&path).unwrap();
    queue.enqueue("a", "{\"a\":1}", t(0)).unwrap();
    queue.enqueue("b", "{\"b\":2}", t(1)).unwrap();
    queue.enqueue("c", "{\"c\":3}", t(2)).unwrap();
    let a = queue.lease("w", LONG, t(3)).unwrap().unwrap();
    let b = queue.lease("w", LONG, t(3)).unwrap().unwrap();
    assert!(queue.finish(&b, t(4)).unwrap());
    drop(queue);

    let queue = SqliteQueue::open(&path).unwrap();
    let status = queue.status(t(5), 10).unwrap();
    let open: Vec<_> = status
        .open
        .iter()
        .map(|j| (&*j.id, j.attempt, j.queued_at))
        .collect();
    assert_eq!(open, [("a", 1, t(0)), ("c", 0, t(2))]);
    assert_eq!(status.recent_done[0].id, "b");
    // The lease taken before the reopen is still held, and still this lease's.
    assert!(!queue.enqueue("b", "{}", t(6)).unwrap());
    let c = queue.lease("w", LONG, t(6)).unwrap().unwrap();
    assert_eq!((&*c.job_id, &*c.payload), ("c", "{\"c\":3}"));
    assert!(queue.finish(&a, t(7)).unwrap());
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
fn status_shows_every_open_job_and_the_counts() {
    let (_dir, queue) = fresh_with(Config {
        max_attempts: 2,
        backoff: Backoff {
            first: Duration::from_secs(10),
            cap: Duration::from_secs(10),
        },
    });
    for id in ["done-1", "done-2", "lost", "waiting", "leased", "queued"] {
        queue.enqueue(id, "{}", t(0)).unwrap();
    }
    for (at, end) in [(1, 1), (2, 3)] {
        let lease = queue.lease("w", LONG, t(at)).unwrap().unwrap();
        queue.finish(&lease, t(end)).unwrap();
    }
    let short = Duration::from_millis(10);
    queue.lease("dead", short, t(0)).unwrap().unwrap();
    let waiting = queue.lease("w", LONG, t(5)).unwrap().unwrap();
    assert_eq!(waiting.job_id, "waiting");
    // "lost" lapsed at t(10) and was taken again at t(20); it lapses again at t(30).
    let lost = queue.lease("dead", short, t(20)).unwrap().unwrap();
    assert_eq!((&*lost.job_id, lost.attempt), ("lost", 2));
    queue.retry(&waiting, t(21)).unwrap();
    queue.lease("busy", LONG, t(40)).unwrap().unwrap();

    let status = queue.status(t(50), 1).unwrap();
    let states: Vec<_> = status
        .open
        .iter()
        .map(|j| (&*j.id, j.state.clone(), j.attempt))
        .collect();
    assert_eq!(
        states,
        [
            ("lost", OpenState::Lost, 2),
            ("waiting", OpenState::Waiting { until: t(10_021) }, 1),
            (
                "leased",
                OpenState::Leased {
                    worker: "busy".to_owned(),
                    until: t(40) + LONG,
                    since: t(40),
                },
                1
            ),
            ("queued", OpenState::Queued, 0),
        ]
    );
    assert_eq!(
        status.counts,
        Counts {
            queued: 1,
            waiting: 1,
            leased: 1,
            lost: 1,
            done: 2,
        }
    );
    let recent: Vec<_> = status.recent_done.iter().map(|j| &*j.id).collect();
    assert_eq!(recent, ["done-2"]);
}

#[test]
fn prune_forgets_done_jobs_finished_before_a_time() {
    let (_dir, queue) = fresh();
    queue.enqueue("a", "{}", t(0)).unwrap();
    queue.enqueue("b", "{}", t(0)).unwrap();
    queue.enqueue("c", "{}", t(0)).unwrap();
    let a = queue.lease("w", LONG, t(0)).unwrap().unwrap();
    let b = queue.lease("w", LONG, t(0)).unwrap().unwrap();
    queue.finish(&a, t(10)).unwrap();
    queue.finish(&b, t(20)).unwrap();
    assert_eq!(queue.prune_done(t(20)).unwrap(), 1);
    let status = queue.status(t(30), 10).unwrap();
    assert_eq!(status.counts.done, 1);
    assert_eq!(status.open.len(), 1);
    // A forgotten id may be enqueued again; a remembered one still may not.
    assert!(queue.enqueue("a", "{}", t(30)).unwrap());
    assert!(!queue.enqueue("b", "{}", t(30)).unwrap());
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
        .query_map(params![0, "w", 0, 2], |row| row.get(3))
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
fn a_job_not_running_is_cancelled_at_once_and_never_leased() {
    let (_dir, queue) = fresh();
    queue.enqueue("a", "{\"p\":1}", t(0)).unwrap();
    queue.enqueue("b", "{}", t(0)).unwrap();
    assert_eq!(
        queue.cancel("a", t(10)).unwrap(),
        Cancel::Removed {
            payload: "{\"p\":1}".to_owned(),
            attempt: 0
        }
    );
    assert_eq!(queue.cancel("a", t(11)).unwrap(), Cancel::AlreadyDone);
    assert_eq!(queue.cancel("nope", t(11)).unwrap(), Cancel::Unknown);
    let lease = queue.lease("w", LONG, t(20)).unwrap().unwrap();
    assert_eq!(lease.job_id, "b");
    let status = queue.status(t(30), 5).unwrap();
    assert_eq!(status.recent_done[0].end, End::Cancelled);
    // A job waiting out its backoff is cancelled the same way.
    queue.retry(&lease, t(40)).unwrap();
    assert!(matches!(
        queue.cancel("b", t(41)).unwrap(),
        Cancel::Removed { attempt: 1, .. }
    ));
    assert_eq!(queue.lease("w", LONG, t(100_000)).unwrap(), None);
}

#[test]
fn a_running_job_is_marked_for_its_worker_and_not_taken_over() {
    let (_dir, queue) = fresh();
    queue.enqueue("a", "{}", t(0)).unwrap();
    let lease = queue
        .lease("w1", Duration::from_millis(100), t(0))
        .unwrap()
        .unwrap();
    assert_eq!(queue.lease_state(&lease).unwrap(), LeaseState::Held);
    assert_eq!(
        queue.cancel("a", t(10)).unwrap(),
        Cancel::Stopping {
            worker: "w1".to_owned()
        }
    );
    assert_eq!(
        queue.lease_state(&lease).unwrap(),
        LeaseState::CancelRequested
    );
    assert!(queue.status(t(20), 0).unwrap().open[0].cancel_requested);
    // Its worker disappears: the job is not leased again, it is reported lost, cancelled.
    assert_eq!(queue.lease("w2", LONG, t(500)).unwrap(), None);
    let lost = queue.take_lost(t(600)).unwrap();
    assert_eq!(lost.len(), 1);
    assert!(lost[0].cancelled);
    assert_eq!(
        queue.status(t(700), 1).unwrap().recent_done[0].end,
        End::Cancelled
    );
}

#[test]
fn a_lapsed_lease_is_cancelled_at_once() {
    let (_dir, queue) = fresh();
    queue.enqueue("a", "{}", t(0)).unwrap();
    let lease = queue
        .lease("w1", Duration::from_millis(100), t(0))
        .unwrap()
        .unwrap();
    assert!(matches!(
        queue.cancel("a", t(500)).unwrap(),
        Cancel::Removed { attempt: 1, .. }
    ));
    // The old lease holds nothing any more, and says so.
    assert_eq!(queue.lease_state(&lease).unwrap(), LeaseState::Lost);
    assert!(!queue.finish(&lease, t(600)).unwrap());
}

#[test]
fn a_released_job_is_queued_at_once_without_using_an_attempt() {
    let (_dir, queue) = fresh();
    queue.enqueue("a", "{}", t(0)).unwrap();
    let lease = queue.lease("w1", LONG, t(0)).unwrap().unwrap();
    assert_eq!(lease.attempt, 1);
    assert!(queue.release(&lease, t(10)).unwrap());
    assert!(!queue.release(&lease, t(11)).unwrap());
    assert!(!queue.finish(&lease, t(12)).unwrap());
    let again = queue.lease("w2", LONG, t(13)).unwrap().unwrap();
    assert_eq!((again.job_id.as_str(), again.attempt), ("a", 1));
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

fn jobs(ids: &[&str]) -> Vec<(String, String)> {
    ids.iter()
        .map(|id| ((*id).to_owned(), format!("{{\"id\":\"{id}\"}}")))
        .collect()
}

#[test]
fn a_delivery_queues_its_jobs_once() {
    let (_dir, queue) = fresh();
    assert!(
        queue
            .enqueue_delivery("github:d1", &jobs(&["a", "b"]), t(0))
            .unwrap()
    );
    // Sent again, with a job more (the triggers changed): nothing.
    assert!(
        !queue
            .enqueue_delivery("github:d1", &jobs(&["a", "b", "c"]), t(1))
            .unwrap()
    );
    // A delivery that queued no job is remembered too.
    assert!(queue.enqueue_delivery("github:d2", &[], t(2)).unwrap());
    assert!(
        !queue
            .enqueue_delivery("github:d2", &jobs(&["d"]), t(3))
            .unwrap()
    );
    // The same id on the other forge is another delivery.
    assert!(
        queue
            .enqueue_delivery("gitlab:d1", &jobs(&["e"]), t(4))
            .unwrap()
    );
    assert_eq!(leased_ids(&queue, t(5)), ["a", "b", "e"]);
    // Pruned, the delivery may come again.
    assert_eq!(queue.prune_done(t(1)).unwrap(), 0);
    assert!(
        queue
            .enqueue_delivery("github:d1", &jobs(&["f"]), t(6))
            .unwrap()
    );
    assert!(!queue.enqueue_delivery("github:d2", &[], t(7)).unwrap());
}

#[test]
fn deliveries_from_many_threads_queue_each_job_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.sqlite3");
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (path, barrier) = (path.clone(), barrier.clone());
            std::thread::spawn(move || {
                let queue = SqliteQueue::open(&path).unwrap();
                barrier.wait();
                (0..50)
                    .filter(|n| {
                        let id = format!("job-{n}");
                        queue
                            .enqueue_delivery(&format!("github:{n}"), &jobs(&[&id]), t(0))
                            .unwrap()
                    })
                    .count()
            })
        })
        .collect();
    let stored: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(stored, 50);
    let queue = SqliteQueue::open(&path).unwrap();
    assert_eq!(queue.status(t(0), 0).unwrap().open.len(), 50);
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
    assert_eq!(user_version(&conn).unwrap(), 3);
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
