//! The slot's loop never waits on the queue: a queue call that blocks does not hold up the job.

use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

use queue::{Cancel, LostJob, QueueError, RetryDecision, SqliteQueue, Status};

use super::*;

/// A real queue whose `lease_state` (the cancel watch) blocks until the job says it ran, or gives
/// up after a minute and notes that it had to.
struct Blocking {
    inner: SqliteQueue,
    asked: AtomicBool,
    answered: AtomicBool,
    gave_up: AtomicBool,
}

impl Queue for Blocking {
    fn enqueue(&self, id: &str, payload: &str, now: SystemTime) -> Result<bool, QueueError> {
        self.inner.enqueue(id, payload, now)
    }
    fn lease(&self, w: &str, d: Duration, now: SystemTime) -> Result<Option<Lease>, QueueError> {
        self.inner.lease(w, d, now)
    }
    fn renew(&self, l: &Lease, d: Duration, now: SystemTime) -> Result<bool, QueueError> {
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
        jobs: &[(String, String)],
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
        Verdict::from(Record::new(
            job,
            Outcome::Completed,
            None,
            draft.attempt(),
            now_ms(),
        ))
    }
}

#[test]
fn a_queue_that_blocks_does_not_hold_up_the_running_job() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(Blocking {
        inner: SqliteQueue::open(&dir.path().join("queue.db")).unwrap(),
        asked: AtomicBool::new(false),
        answered: AtomicBool::new(false),
        gave_up: AtomicBool::new(false),
    });
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
    let options = LoopOptions {
        worker_id: "test:1".to_owned(),
        lease_for: Duration::from_secs(300),
        concurrency: 1,
        until_empty: true,
        poll: Duration::from_millis(10),
        cancel_poll: Duration::from_millis(10),
        on_failure: None,
    };
    let summary = run(
        runner.clone(),
        queue.clone(),
        Arc::new(Records::new(dir.path().join("runs"))),
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
