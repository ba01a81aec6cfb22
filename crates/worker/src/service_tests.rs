//! The slot's loop never waits on the queue: a queue call that blocks does not hold up the job.

use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use protocol::reason::Outcome;
use queue::{
    Cancel, Lease, LeaseState, LiveView, LostJob, NewJob, QueueError, RetryDecision, SqliteQueue,
    Status, WorkerCard, WorkerSeen,
};
use records::record::now_ms;

use super::*;

/// A real queue whose `lease_state` (the cancel watch) blocks until the job says it ran, or gives
/// up after a minute and notes that it had to.
struct Blocking {
    inner: SqliteQueue,
    asked: AtomicBool,
    answered: AtomicBool,
    gave_up: AtomicBool,
    /// Every renewal fails, as with the queue away.
    renew_fails: AtomicBool,
}

impl Blocking {
    fn open(path: &std::path::Path) -> Blocking {
        Blocking {
            inner: SqliteQueue::open(path).unwrap(),
            asked: AtomicBool::new(false),
            answered: AtomicBool::new(false),
            gave_up: AtomicBool::new(false),
            renew_fails: AtomicBool::new(false),
        }
    }
}

impl Queue for Blocking {
    fn enqueue_job(&self, job: &NewJob, now: SystemTime) -> Result<bool, QueueError> {
        self.inner.enqueue_job(job, now)
    }
    fn lease_as(
        &self,
        w: &str,
        labels: &[String],
        d: Duration,
        now: SystemTime,
    ) -> Result<Option<Lease>, QueueError> {
        self.inner.lease_as(w, labels, d, now)
    }
    fn announce(&self, card: &WorkerCard, now: SystemTime) -> Result<(), QueueError> {
        self.inner.announce(card, now)
    }
    fn workers(&self) -> Result<Vec<WorkerSeen>, QueueError> {
        self.inner.workers()
    }
    fn leave(&self, id: &str) -> Result<(), QueueError> {
        self.inner.leave(id)
    }
    fn live_put(
        &self,
        id: &str,
        snapshot: &str,
        lines: &[String],
        now: SystemTime,
    ) -> Result<(), QueueError> {
        self.inner.live_put(id, snapshot, lines, now)
    }
    fn live_get(&self, id: &str, from: u64, max: usize) -> Result<Option<LiveView>, QueueError> {
        self.inner.live_get(id, from, max)
    }
    fn live_prune(&self, before: SystemTime) -> Result<usize, QueueError> {
        self.inner.live_prune(before)
    }
    fn pin(&self, server: &str) -> Result<Option<String>, QueueError> {
        self.inner.pin(server)
    }
    fn pins(&self) -> Result<Vec<(String, String)>, QueueError> {
        self.inner.pins()
    }
    fn put_pin(
        &self,
        server: &str,
        pin: &str,
        first: bool,
        now: SystemTime,
    ) -> Result<bool, QueueError> {
        self.inner.put_pin(server, pin, first, now)
    }
    fn put_pin_drift(&self, server: &str, drift: &str, now: SystemTime) -> Result<(), QueueError> {
        self.inner.put_pin_drift(server, drift, now)
    }
    fn pin_drifts(&self) -> Result<Vec<(String, String)>, QueueError> {
        self.inner.pin_drifts()
    }
    fn link_rerun(&self, original: &str, rerun: &str) -> Result<(), QueueError> {
        self.inner.link_rerun(original, rerun)
    }
    fn reruns(&self, original: &str) -> Result<Vec<String>, QueueError> {
        self.inner.reruns(original)
    }
    fn renew(&self, l: &Lease, d: Duration, now: SystemTime) -> Result<bool, QueueError> {
        if self.renew_fails.load(Ordering::SeqCst) {
            return Err(QueueError::Redis {
                op: "renew a lease",
                detail: "connection refused".to_owned(),
            });
        }
        self.inner.renew(l, d, now)
    }
    fn finish(&self, l: &Lease, now: SystemTime) -> Result<bool, QueueError> {
        self.inner.finish(l, now)
    }
    fn retry(&self, l: &Lease, now: SystemTime) -> Result<RetryDecision, QueueError> {
        self.inner.retry(l, now)
    }
    fn take_lost(&self, now: SystemTime) -> Result<Vec<LostJob>, QueueError> {
        self.inner.take_lost(now)
    }
    fn status(&self, now: SystemTime, recent: usize) -> Result<Status, QueueError> {
        self.inner.status(now, recent)
    }
    fn enqueue_delivery(
        &self,
        key: &str,
        jobs: &[NewJob],
        now: SystemTime,
    ) -> Result<bool, QueueError> {
        self.inner.enqueue_delivery(key, jobs, now)
    }
    fn prune_done(&self, before: SystemTime) -> Result<usize, QueueError> {
        self.inner.prune_done(before)
    }
    fn cancel(&self, id: &str, now: SystemTime) -> Result<Cancel, QueueError> {
        self.inner.cancel(id, now)
    }
    fn lease_state(&self, l: &Lease) -> Result<LeaseState, QueueError> {
        self.asked.store(true, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !self.answered.load(Ordering::SeqCst) {
            if std::time::Instant::now() > deadline {
                self.gave_up.store(true, Ordering::SeqCst);
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.inner.lease_state(l)
    }
    fn release(&self, l: &Lease, now: SystemTime) -> Result<bool, QueueError> {
        self.inner.release(l, now)
    }
}

/// A job that waits until the cancel watch is waiting on the queue, then answers it: it can only
/// run while the watch waits if the watch waits off the slot's loop.
struct Answering {
    queue: Arc<Blocking>,
    ran: Mutex<bool>,
}

impl Runner for Answering {
    async fn process(&self, job: &Job, draft: Draft, _stop: StopSignal) -> Verdict {
        while !self.queue.asked.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.queue.answered.store(true, Ordering::SeqCst);
        *self.ran.lock().unwrap() = true;
        completed(job, &draft)
    }
}

/// One slot that runs until the queue is empty, polling often, with leases of `lease_for`.
fn one_slot(lease_for: Duration) -> LoopOptions {
    LoopOptions {
        worker_id: "test:1".to_owned(),
        lease_for,
        concurrency: 1,
        until_empty: true,
        poll: Duration::from_millis(10),
        cancel_poll: Duration::from_millis(10),
        on_failure: None,
        disk: None,
        retention: None,
        labels: Vec::new(),
        heartbeat: None,
        live: false,
    }
}

/// The verdict on a job that completed.
fn completed(job: &Job, draft: &Draft) -> Verdict {
    Verdict::from(Record::new(
        job,
        Outcome::Completed,
        None,
        draft.attempt(),
        now_ms(),
    ))
}

#[test]
fn a_queue_that_blocks_does_not_hold_up_the_running_job() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(Blocking::open(&dir.path().join("queue.db")));
    let job = Job::new("j-1", "cli", "local");
    queue
        .enqueue(
            "j-1",
            &serde_json::to_string(&job).unwrap(),
            SystemTime::now(),
        )
        .unwrap();
    let runner = Arc::new(Answering {
        queue: queue.clone(),
        ran: Mutex::new(false),
    });
    let options = one_slot(Duration::from_secs(300));
    let summary = run(
        runner.clone(),
        queue.clone(),
        Arc::new(Records::sqlite(&dir.path().join("records.sqlite3")).unwrap()),
        &options,
        Arc::new(Control::default()),
    );
    // The probe ran: the watch asked the queue while the job ran, and the job finished.
    assert!(queue.asked.load(Ordering::SeqCst));
    assert!(*runner.ran.lock().unwrap());
    assert_eq!(summary.records.load(Ordering::Relaxed), 1);
    // The job answered the waiting watch; it was never stuck behind it.
    assert!(
        !queue.gave_up.load(Ordering::SeqCst),
        "the job could not run while the queue call waited: the call ran on the slot's loop"
    );
}

/// Runs the loop once to its end over a queue holding one job, with `min_free` bytes asked of the
/// disk of `dir` and a pager that writes what it is told into `dir/paged`.
fn run_with_disk(dir: &std::path::Path, queue: &Arc<SqliteQueue>, min_free: u64) -> Arc<Summary> {
    let pager = dir.join("pager");
    std::fs::write(
        &pager,
        format!(
            "#!/bin/sh\necho \"$@\" >> {}\n",
            dir.join("paged").display()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&pager, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let options = LoopOptions {
        concurrency: 2,
        on_failure: Some(pager),
        disk: Some(DiskGate {
            folder: dir.to_owned(),
            min_free,
        }),
        ..one_slot(Duration::from_secs(300))
    };
    run(
        Arc::new(Completing),
        queue.clone(),
        Arc::new(Records::sqlite(&dir.join("records.sqlite3")).unwrap()),
        &options,
        Arc::new(Control::default()),
    )
}

/// Completes every job at once.
struct Completing;

impl Runner for Completing {
    async fn process(&self, job: &Job, draft: Draft, _stop: StopSignal) -> Verdict {
        completed(job, &draft)
    }
}

/// A disk with less room than the minimum starts no job: the job waits in the queue, no record is
/// written, and the worker pages once for its whole pool of slots, with the reason. With room again
/// (the control) the same job runs and is recorded.
#[test]
fn a_nearly_full_disk_starts_no_job_and_the_job_waits_in_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(SqliteQueue::open(&dir.path().join("queue.db")).unwrap());
    let job = Job::new("j-disk", "cli", "local");
    queue
        .enqueue(
            "j-disk",
            &serde_json::to_string(&job).unwrap(),
            SystemTime::now(),
        )
        .unwrap();
    let summary = run_with_disk(dir.path(), &queue, u64::MAX);
    assert!(summary.disk_full.load(Ordering::SeqCst));
    assert_eq!(summary.records.load(Ordering::Relaxed), 0);
    let status = queue.status(SystemTime::now(), 10).unwrap();
    assert_eq!(status.open.len(), 1, "the job is not in the queue any more");
    assert_eq!(status.open[0].attempt, 0, "waiting spent an attempt");
    let paged = std::fs::read_to_string(dir.path().join("paged")).unwrap();
    assert_eq!(paged.lines().count(), 1, "{paged}");
    assert!(paged.starts_with("- failed disk-nearly-full "), "{paged}");
    // Room again: the job runs.
    let summary = run_with_disk(dir.path(), &queue, 0);
    assert!(!summary.disk_full.load(Ordering::SeqCst));
    assert_eq!(summary.records.load(Ordering::Relaxed), 1);
    assert!(queue.status(SystemTime::now(), 10).unwrap().open.is_empty());
}

/// A job that takes two seconds, and notes whether it got to its end.
struct Slow {
    finished: AtomicBool,
}

impl Runner for Slow {
    async fn process(&self, job: &Job, draft: Draft, _stop: StopSignal) -> Verdict {
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.finished.store(true, Ordering::SeqCst);
        completed(job, &draft)
    }
}

/// Runs one two-second job to its record, with leases of 300 ms, over a queue whose renewals
/// fail or not; the record.
fn run_slow_job(renewals_fail: bool, runner: &Arc<Slow>) -> Record {
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(Blocking::open(&dir.path().join("queue.db")));
    queue.answered.store(true, Ordering::SeqCst);
    queue.renew_fails.store(renewals_fail, Ordering::SeqCst);
    let job = Job::new("j-1", "cli", "local");
    let payload = serde_json::to_string(&job).unwrap();
    queue.enqueue("j-1", &payload, SystemTime::now()).unwrap();
    let options = one_slot(Duration::from_millis(300));
    let records = Arc::new(Records::sqlite(&dir.path().join("records.sqlite3")).unwrap());
    run(
        runner.clone(),
        queue,
        records.clone(),
        &options,
        Arc::new(Control::default()),
    );
    records.read("j-1").unwrap()
}

#[test]
fn a_lease_the_queue_does_not_confirm_for_its_length_ends_the_job_unfinished() {
    // The control: renewals answered, the job runs its two seconds and completes.
    let runner = Arc::new(Slow {
        finished: AtomicBool::new(false),
    });
    let record = run_slow_job(false, &runner);
    assert!(runner.finished.load(Ordering::SeqCst));
    assert_eq!(record.outcome, Outcome::Completed);
    // With no renewal confirmed for 300 ms another worker may have the job: each attempt is
    // dropped long before its end, and the job ends as lost with its worker, never completed
    // by a worker that no longer held it.
    let runner = Arc::new(Slow {
        finished: AtomicBool::new(false),
    });
    let record = run_slow_job(true, &runner);
    assert!(
        !runner.finished.load(Ordering::SeqCst),
        "an attempt ran to its end"
    );
    assert_eq!(record.outcome, Outcome::Failed);
    assert_eq!(record.reason.map(|r| r.as_str()), Some("worker-lost"));
}
