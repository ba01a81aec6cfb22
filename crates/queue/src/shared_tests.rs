//! The queue's behaviour, as every backend must have it: each test takes a fresh, empty store and
//! opens handles on it, and runs once on the SQLite file and once on a real Redis (Debian's
//! redis-server, started by the test).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{
    Backoff, Cancel, Config, Counts, DoneJob, End, LeaseState, LostJob, MAX_ATTEMPTS, NewJob,
    OpenState, Placement, Queue, RecordIndex, RedisQueue, RedisTarget, RetryDecision, SqliteQueue,
    WorkerCard, WorkerSeen,
};

/// A long lease: nothing lapses unless a test moves the clock past it.
pub(crate) const LONG: Duration = Duration::from_secs(3600);

/// The test clock: `ms` milliseconds after a fixed start.
pub(crate) fn t(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms)
}

/// A fresh, empty store of one backend, and handles on it.
pub(crate) trait Store: Sync {
    fn open_with(&self, config: Config) -> Box<dyn Queue>;

    fn open(&self) -> Box<dyn Queue> {
        self.open_with(Config::default())
    }

    /// A handle on the store's records.
    fn index(&self) -> Box<dyn RecordIndex>;
}

/// A SQLite file in a folder of its own.
pub(crate) struct SqliteStore(tempfile::TempDir);

impl SqliteStore {
    pub(crate) fn new() -> SqliteStore {
        SqliteStore(tempfile::tempdir().unwrap())
    }
}

impl Store for SqliteStore {
    fn open_with(&self, config: Config) -> Box<dyn Queue> {
        Box::new(SqliteQueue::open_with(&self.0.path().join("queue.sqlite3"), config).unwrap())
    }

    fn index(&self) -> Box<dyn RecordIndex> {
        Box::new(SqliteQueue::open(&self.0.path().join("queue.sqlite3")).unwrap())
    }
}

/// A redis-server of its own.
pub(crate) struct RedisStore(testkit::redis::RedisServer);

impl RedisStore {
    pub(crate) fn new() -> RedisStore {
        RedisStore(testkit::redis::RedisServer::start())
    }
}

impl Store for RedisStore {
    fn open_with(&self, config: Config) -> Box<dyn Queue> {
        let target = RedisTarget {
            url: self.0.url(),
            password: None,
        };
        Box::new(RedisQueue::open_with(&target, config, Duration::from_secs(10)).unwrap())
    }

    fn index(&self) -> Box<dyn RecordIndex> {
        Box::new(self.redis())
    }
}

impl RedisStore {
    pub(crate) fn redis(&self) -> RedisQueue {
        let target = RedisTarget {
            url: self.0.url(),
            password: None,
        };
        RedisQueue::open_with(&target, Config::default(), Duration::from_secs(10)).unwrap()
    }
}

fn leased_ids(queue: &dyn Queue, now: SystemTime) -> Vec<String> {
    std::iter::from_fn(|| queue.lease("w", LONG, now).unwrap())
        .map(|lease| lease.job_id)
        .collect()
}

pub(crate) fn jobs(ids: &[&str]) -> Vec<NewJob> {
    ids.iter()
        .map(|id| NewJob::plain(id, &format!("{{\"id\":\"{id}\"}}")))
        .collect()
}

/// A job that needs `needs`, in `group`.
fn placed(id: &str, needs: &[&str], group: Option<&str>, supersede: bool) -> NewJob {
    NewJob {
        placement: Placement {
            needs: needs.iter().map(|n| (*n).to_owned()).collect(),
            group: group.map(str::to_owned),
            supersede,
        },
        ..NewJob::plain(id, "{}")
    }
}

fn labels(l: &[&str]) -> Vec<String> {
    l.iter().map(|n| (*n).to_owned()).collect()
}

fn lease_as(queue: &dyn Queue, l: &[&str], now: SystemTime) -> Option<String> {
    queue
        .lease_as("w", &labels(l), LONG, now)
        .unwrap()
        .map(|lease| lease.job_id)
}

pub(crate) fn a_job_is_leased_only_by_a_worker_with_every_label_it_needs(store: &dyn Store) {
    let queue = store.open();
    queue
        .enqueue_job(&placed("gpu-eu", &["gpu", "zone:eu"], None, false), t(0))
        .unwrap();
    queue
        .enqueue_job(&placed("on-x", &["host:x"], None, false), t(0))
        .unwrap();
    queue
        .enqueue_job(&placed("anywhere", &[], None, false), t(0))
        .unwrap();
    // A worker without labels passes the two that need some, and takes the one that needs none.
    assert_eq!(lease_as(&*queue, &[], t(1)).as_deref(), Some("anywhere"));
    assert_eq!(lease_as(&*queue, &[], t(1)), None);
    assert_eq!(lease_as(&*queue, &["host:y", "gpu"], t(1)), None);
    assert_eq!(
        lease_as(&*queue, &["host:x"], t(1)).as_deref(),
        Some("on-x")
    );
    assert_eq!(
        lease_as(&*queue, &["host:y", "zone:eu", "gpu"], t(1)).as_deref(),
        Some("gpu-eu")
    );
    let status = queue.status(t(2), 0).unwrap();
    let gpu = status.open.iter().find(|j| j.id == "gpu-eu").unwrap();
    assert_eq!(gpu.needs, labels(&["gpu", "zone:eu"]));
    assert_eq!(
        status
            .open
            .iter()
            .find(|j| j.id == "anywhere")
            .unwrap()
            .needs,
        Vec::<String>::new()
    );
}

pub(crate) fn jobs_of_one_group_run_one_at_a_time_oldest_first(store: &dyn Store) {
    let queue = store.open_with(steady_backoff(Duration::from_secs(1)));
    queue
        .enqueue_job(&placed("first", &[], Some("github:o/r#1"), false), t(0))
        .unwrap();
    queue
        .enqueue_job(&placed("second", &[], Some("github:o/r#1"), false), t(0))
        .unwrap();
    queue
        .enqueue_job(&placed("other", &[], Some("github:o/r#2"), false), t(0))
        .unwrap();
    let first = queue
        .lease("w", Duration::from_secs(10), t(1))
        .unwrap()
        .unwrap();
    assert_eq!(first.job_id, "first");
    // "second" waits for "first"; the other issue's job does not.
    assert_eq!(lease_as(&*queue, &[], t(1)).as_deref(), Some("other"));
    assert_eq!(lease_as(&*queue, &[], t(2)), None);
    // A lapsed lease of the first is taken again before the second.
    let again = queue.lease("w2", LONG, t(20_000)).unwrap().unwrap();
    assert_eq!((again.job_id.as_str(), again.attempt), ("first", 2));
    // Only once it is done does the second come.
    assert_eq!(lease_as(&*queue, &[], t(20_001)), None);
    assert!(matches!(
        queue.retry(&again, t(20_001)).unwrap(),
        RetryDecision::Exhausted
    ));
    assert_eq!(lease_as(&*queue, &[], t(20_002)).as_deref(), Some("second"));
    assert_eq!(
        queue
            .status(t(20_003), 0)
            .unwrap()
            .open
            .iter()
            .find(|j| j.id == "second")
            .unwrap()
            .group
            .as_deref(),
        Some("github:o/r#1")
    );
}

pub(crate) fn a_superseding_job_cancels_its_group_and_waits_for_the_running_one(store: &dyn Store) {
    let queue = store.open();
    queue
        .enqueue_job(&placed("running", &[], Some("g"), false), t(0))
        .unwrap();
    queue
        .enqueue_job(&placed("queued", &[], Some("g"), false), t(0))
        .unwrap();
    queue
        .enqueue_job(&placed("elsewhere", &[], Some("h"), false), t(0))
        .unwrap();
    let running = queue.lease("w", LONG, t(1)).unwrap().unwrap();
    assert_eq!(running.job_id, "running");
    assert!(
        queue
            .enqueue_job(&placed("newest", &[], Some("g"), true), t(2))
            .unwrap()
    );
    assert_eq!(
        queue.lease_state(&running).unwrap(),
        LeaseState::CancelRequested
    );
    let lost = queue.take_lost(t(3)).unwrap();
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(
        (lost[0].job_id.as_str(), lost[0].cancelled),
        ("queued", true)
    );
    // The other group's job runs; the newest waits for the running one to stop.
    assert_eq!(lease_as(&*queue, &[], t(4)).as_deref(), Some("elsewhere"));
    assert_eq!(lease_as(&*queue, &[], t(4)), None);
    assert!(queue.finish(&running, t(5)).unwrap());
    assert_eq!(lease_as(&*queue, &[], t(6)).as_deref(), Some("newest"));
}

fn card(id: &str, running: u32) -> WorkerCard {
    WorkerCard {
        id: id.to_owned(),
        host: "h".to_owned(),
        pid: 7,
        version: "0.1.0".to_owned(),
        labels: labels(&["host:h", "gpu"]),
        concurrency: 2,
        started_ms: 5,
        running,
        draining: false,
    }
}

pub(crate) fn workers_announce_themselves_refresh_and_leave(store: &dyn Store) {
    let queue = store.open();
    assert!(queue.workers().unwrap().is_empty());
    queue.announce(&card("h:1", 0), t(0)).unwrap();
    queue.announce(&card("h:2", 0), t(1)).unwrap();
    queue.announce(&card("h:1", 2), t(5)).unwrap();
    let seen = queue.workers().unwrap();
    assert_eq!(
        seen,
        vec![
            WorkerSeen {
                card: card("h:1", 2),
                last_seen: t(5)
            },
            WorkerSeen {
                card: card("h:2", 0),
                last_seen: t(1)
            },
        ]
    );
    queue.leave("h:2").unwrap();
    assert_eq!(queue.workers().unwrap().len(), 1);
    // A worker unseen for a day is forgotten when another announces itself.
    let day = u64::try_from(crate::FORGET_WORKERS_AFTER.as_millis()).unwrap();
    queue.announce(&card("h:3", 0), t(5 + day + 1)).unwrap();
    let ids: Vec<_> = queue
        .workers()
        .unwrap()
        .into_iter()
        .map(|w| w.card.id)
        .collect();
    assert_eq!(ids, ["h:3"]);
}

/// Each test of the suite, once a backend.
macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(#[test] fn $name() { super::$name(&super::SqliteStore::new()) })*
        }
        mod on_redis {
            $(#[test] fn $name() { super::$name(&super::RedisStore::new()) })*
        }
    };
}

suite!(
    jobs_are_leased_in_enqueue_order,
    an_empty_queue_leases_nothing_and_a_new_job_is_available_at_once,
    a_duplicate_id_is_not_added,
    two_handles_on_one_file_never_hold_the_same_job,
    concurrent_workers_lease_every_job_exactly_once,
    the_queue_is_shared_as_a_trait_object,
    a_lapsed_lease_is_leased_again_with_attempt_2,
    a_lapsed_last_attempt_is_lost_and_reported_once,
    take_lost_settles_a_lapsed_last_attempt_by_itself,
    a_stale_lease_cannot_renew_finish_or_retry,
    renew_keeps_a_job_from_lapsing,
    a_retried_job_waits_out_its_backoff,
    a_retried_job_keeps_its_place_in_line,
    a_retry_on_the_last_attempt_is_exhausted,
    the_queue_survives_reopening,
    status_shows_every_open_job_and_the_counts,
    prune_forgets_done_jobs_finished_before_a_time,
    a_job_not_running_is_cancelled_at_once_and_never_leased,
    a_running_job_is_marked_for_its_worker_and_not_taken_over,
    a_lapsed_lease_is_cancelled_at_once,
    a_released_job_is_queued_at_once_without_using_an_attempt,
    a_delivery_queues_its_jobs_once,
    deliveries_from_many_threads_queue_each_job_once,
    a_job_is_leased_only_by_a_worker_with_every_label_it_needs,
    jobs_of_one_group_run_one_at_a_time_oldest_first,
    a_superseding_job_cancels_its_group_and_waits_for_the_running_one,
    workers_announce_themselves_refresh_and_leave,
    a_live_view_grows_is_read_from_any_line_and_is_pruned,
    reruns_are_linked_to_their_original_in_order,
    a_servers_first_pin_stays_and_an_approval_replaces_it_and_its_drift,
    two_workers_pinning_one_server_at_once_keep_one_pin,
);

pub(crate) fn a_servers_first_pin_stays_and_an_approval_replaces_it_and_its_drift(
    store: &dyn Store,
) {
    let queue = store.open();
    assert_eq!(queue.pin("docs").unwrap(), None);
    assert!(queue.pins().unwrap().is_empty());
    // The first job pins; a later first-use store leaves the pin as it is.
    assert!(queue.put_pin("docs", "v1", true, t(1)).unwrap());
    assert!(!queue.put_pin("docs", "v2", true, t(2)).unwrap());
    assert_eq!(queue.pin("docs").unwrap().as_deref(), Some("v1"));
    // A job notes drift; another handle (another worker) sees it and the pin.
    queue.put_pin_drift("docs", "saw v2", t(3)).unwrap();
    queue.put_pin_drift("docs", "saw v3", t(4)).unwrap();
    queue.put_pin("wiki", "w1", true, t(5)).unwrap();
    let other = store.open();
    assert_eq!(
        other.pin_drifts().unwrap(),
        [("docs".to_owned(), "saw v3".to_owned())]
    );
    assert_eq!(
        other.pins().unwrap(),
        [
            ("docs".to_owned(), "v1".to_owned()),
            ("wiki".to_owned(), "w1".to_owned())
        ]
    );
    // Approving stores the new pin and forgets the drift.
    assert!(other.put_pin("docs", "v3", false, t(6)).unwrap());
    assert_eq!(queue.pin("docs").unwrap().as_deref(), Some("v3"));
    assert!(queue.pin_drifts().unwrap().is_empty());
}

pub(crate) fn two_workers_pinning_one_server_at_once_keep_one_pin(store: &dyn Store) {
    let barrier = Arc::new(Barrier::new(8));
    let stored: Vec<bool> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|n| {
                let queue = store.open();
                let barrier = barrier.clone();
                s.spawn(move || {
                    barrier.wait();
                    queue
                        .put_pin("docs", &format!("pin {n}"), true, t(1))
                        .unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(stored.iter().filter(|s| **s).count(), 1, "{stored:?}");
    let winner = stored.iter().position(|s| *s).unwrap();
    assert_eq!(
        store.open().pin("docs").unwrap(),
        Some(format!("pin {winner}"))
    );
}

pub(crate) fn reruns_are_linked_to_their_original_in_order(store: &dyn Store) {
    let queue = store.open();
    assert!(queue.reruns("a").unwrap().is_empty());
    queue.link_rerun("a", "b").unwrap();
    queue.link_rerun("a", "c").unwrap();
    queue.link_rerun("b", "d").unwrap();
    assert_eq!(queue.reruns("a").unwrap(), ["b", "c"]);
    assert_eq!(queue.reruns("b").unwrap(), ["d"]);
}

pub(crate) fn a_live_view_grows_is_read_from_any_line_and_is_pruned(store: &dyn Store) {
    let queue = store.open();
    assert_eq!(queue.live_get("j", 0, 10).unwrap(), None);
    let lines = |r: std::ops::Range<u32>| r.map(|n| format!("line {n}")).collect::<Vec<_>>();
    queue.live_put("j", "first", &lines(0..3), t(1)).unwrap();
    queue.live_put("j", "second", &[], t(2)).unwrap();
    queue.live_put("j", "third", &lines(3..5), t(3)).unwrap();
    queue.live_put("k", "other", &lines(0..1), t(9)).unwrap();
    let view = queue.live_get("j", 0, 100).unwrap().unwrap();
    assert_eq!(
        (view.snapshot.as_str(), view.total, view.updated),
        ("third", 5, t(3))
    );
    assert_eq!(view.lines, lines(0..5));
    let tail = queue.live_get("j", 3, 1).unwrap().unwrap();
    assert_eq!((tail.lines, tail.total), (lines(3..4), 5));
    assert!(
        queue
            .live_get("j", 5, 10)
            .unwrap()
            .unwrap()
            .lines
            .is_empty()
    );
    // Views last written before a time are forgotten, lines and all.
    assert_eq!(queue.live_prune(t(5)).unwrap(), 1);
    assert_eq!(queue.live_get("j", 0, 10).unwrap(), None);
    queue.live_put("j", "again", &[], t(10)).unwrap();
    assert_eq!(queue.live_get("j", 0, 10).unwrap().unwrap().total, 0);
    assert_eq!(
        queue.live_get("k", 0, 10).unwrap().unwrap().lines,
        lines(0..1)
    );
}

pub(crate) fn jobs_are_leased_in_enqueue_order(store: &dyn Store) {
    let queue = store.open();
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
    assert_eq!(leased_ids(&*queue, t(1)), ["a", "b"]);
}

pub(crate) fn an_empty_queue_leases_nothing_and_a_new_job_is_available_at_once(store: &dyn Store) {
    let queue = store.open();
    assert_eq!(queue.lease("w", LONG, t(0)).unwrap(), None);
    queue.enqueue("a", "{}", t(5)).unwrap();
    assert_eq!(queue.status(t(5), 0).unwrap().counts.queued, 1);
    assert_eq!(leased_ids(&*queue, t(5)), ["a"]);
}

pub(crate) fn a_duplicate_id_is_not_added(store: &dyn Store) {
    let queue = store.open();
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

pub(crate) fn two_handles_on_one_file_never_hold_the_same_job(store: &dyn Store) {
    let one = store.open();
    let two = store.open();
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

pub(crate) fn concurrent_workers_lease_every_job_exactly_once(store: &dyn Store) {
    const JOBS: usize = 200;
    const WORKERS: usize = 4;
    let queue = store.open();
    for i in 0..JOBS {
        assert!(queue.enqueue(&format!("job-{i}"), "{}", t(0)).unwrap());
    }
    let start = Barrier::new(WORKERS);
    let mut times: HashMap<String, usize> = HashMap::new();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let start = &start;
                scope.spawn(move || {
                    let queue = store.open();
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
        for worker in workers {
            for id in worker.join().unwrap() {
                *times.entry(id).or_default() += 1;
            }
        }
    });
    assert_eq!(times.len(), JOBS, "some jobs were never leased");
    let twice: Vec<_> = times.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "leased more than once: {twice:?}");
    let status = queue.status(t(3), 0).unwrap();
    assert!(status.open.is_empty());
    assert_eq!(status.counts.done, JOBS);
}

pub(crate) fn the_queue_is_shared_as_a_trait_object(store: &dyn Store) {
    let queue = store.open();
    let queue: Arc<dyn Queue> = Arc::from(queue);
    queue.enqueue("a", "{}", t(0)).unwrap();
    let other = Arc::clone(&queue);
    let lease = std::thread::spawn(move || other.lease("w", LONG, t(1)).unwrap())
        .join()
        .unwrap()
        .unwrap();
    assert!(queue.finish(&lease, t(2)).unwrap());
}

pub(crate) fn a_lapsed_lease_is_leased_again_with_attempt_2(store: &dyn Store) {
    let queue = store.open();
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

pub(crate) fn a_lapsed_last_attempt_is_lost_and_reported_once(store: &dyn Store) {
    let queue = store.open();
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

pub(crate) fn take_lost_settles_a_lapsed_last_attempt_by_itself(store: &dyn Store) {
    let queue = store.open_with(Config {
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
    assert_eq!(leased_ids(&*queue, t(12)), ["b"]);
}

pub(crate) fn a_stale_lease_cannot_renew_finish_or_retry(store: &dyn Store) {
    let queue = store.open();
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

pub(crate) fn renew_keeps_a_job_from_lapsing(store: &dyn Store) {
    let queue = store.open();
    queue.enqueue("a", "{}", t(0)).unwrap();
    let second = Duration::from_millis(1000);
    let lease = queue.lease("w", second, t(0)).unwrap().unwrap();
    assert!(queue.renew(&lease, second, t(900)).unwrap());
    assert_eq!(queue.lease("other", LONG, t(1500)).unwrap(), None);
    assert_eq!(queue.lease("other", LONG, t(1900)).unwrap(), None);
    let next = queue.lease("other", LONG, t(1901)).unwrap().unwrap();
    assert_eq!(next.attempt, 2);
}

pub(crate) fn a_retried_job_waits_out_its_backoff(store: &dyn Store) {
    let queue = store.open_with(Config {
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

/// The default configuration, with every retry waiting `wait`.
fn steady_backoff(wait: Duration) -> Config {
    Config {
        backoff: Backoff {
            first: wait,
            cap: wait,
        },
        ..Config::default()
    }
}

pub(crate) fn a_retried_job_keeps_its_place_in_line(store: &dyn Store) {
    let queue = store.open_with(steady_backoff(Duration::from_millis(100)));
    queue.enqueue("old", "{}", t(0)).unwrap();
    let lease = queue.lease("w", LONG, t(0)).unwrap().unwrap();
    queue.enqueue("new", "{}", t(1)).unwrap();
    queue.retry(&lease, t(2)).unwrap();
    assert_eq!(leased_ids(&*queue, t(1000)), ["old", "new"]);
}

pub(crate) fn a_retry_on_the_last_attempt_is_exhausted(store: &dyn Store) {
    let queue = store.open_with(steady_backoff(Duration::from_millis(100)));
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

pub(crate) fn the_queue_survives_reopening(store: &dyn Store) {
    let queue = store.open();
    queue.enqueue("a", "{\"a\":1}", t(0)).unwrap();
    queue.enqueue("b", "{\"b\":2}", t(1)).unwrap();
    queue.enqueue("c", "{\"c\":3}", t(2)).unwrap();
    let a = queue.lease("w", LONG, t(3)).unwrap().unwrap();
    let b = queue.lease("w", LONG, t(3)).unwrap().unwrap();
    assert!(queue.finish(&b, t(4)).unwrap());
    drop(queue);

    let queue = store.open();
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

pub(crate) fn status_shows_every_open_job_and_the_counts(store: &dyn Store) {
    let queue = store.open_with(Config {
        max_attempts: 2,
        ..steady_backoff(Duration::from_secs(10))
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

pub(crate) fn prune_forgets_done_jobs_finished_before_a_time(store: &dyn Store) {
    let queue = store.open();
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

pub(crate) fn a_job_not_running_is_cancelled_at_once_and_never_leased(store: &dyn Store) {
    let queue = store.open();
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

pub(crate) fn a_running_job_is_marked_for_its_worker_and_not_taken_over(store: &dyn Store) {
    let queue = store.open();
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

pub(crate) fn a_lapsed_lease_is_cancelled_at_once(store: &dyn Store) {
    let queue = store.open();
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

pub(crate) fn a_released_job_is_queued_at_once_without_using_an_attempt(store: &dyn Store) {
    let queue = store.open();
    queue.enqueue("a", "{}", t(0)).unwrap();
    let lease = queue.lease("w1", LONG, t(0)).unwrap().unwrap();
    assert_eq!(lease.attempt, 1);
    assert!(queue.release(&lease, t(10)).unwrap());
    assert!(!queue.release(&lease, t(11)).unwrap());
    assert!(!queue.finish(&lease, t(12)).unwrap());
    let again = queue.lease("w2", LONG, t(13)).unwrap().unwrap();
    assert_eq!((again.job_id.as_str(), again.attempt), ("a", 1));
}

pub(crate) fn a_delivery_queues_its_jobs_once(store: &dyn Store) {
    let queue = store.open();
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
    assert_eq!(leased_ids(&*queue, t(5)), ["a", "b", "e"]);
    // Pruned, the delivery may come again.
    assert_eq!(queue.prune_done(t(1)).unwrap(), 0);
    assert!(
        queue
            .enqueue_delivery("github:d1", &jobs(&["f"]), t(6))
            .unwrap()
    );
    assert!(!queue.enqueue_delivery("github:d2", &[], t(7)).unwrap());
}

pub(crate) fn deliveries_from_many_threads_queue_each_job_once(store: &dyn Store) {
    let barrier = Barrier::new(4);
    let stored: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let queue = store.open();
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
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(stored, 50);
    let queue = store.open();
    assert_eq!(queue.status(t(0), 0).unwrap().open.len(), 50);
}

#[path = "records_suite.rs"]
mod records_suite;
