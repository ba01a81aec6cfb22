//! The worker's loop: `concurrency` slots, each a thread of its own (bubblewrap dies with the
//! thread that started it, so a slot's thread lives as long as its jobs), each taking a job from
//! the queue, keeping its lease alive while it runs, and settling it: a record and `finish` when it
//! is over, `retry` for an infrastructure fault (the record only once no attempt is left). A record
//! is written before the job is marked done, so a worker killed in between runs the job again and
//! the second record is not written (records are written once).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use pickup::job::Job;

use crate::pipeline::{Verdict, Worker, log};
use crate::queue::{Lease, Queue, RetryDecision};
use crate::record::{Outcome, Record, Records, now_ms, reasons, unix_ms};

/// What runs a leased job: the real [`Worker`] (gates, secrets, sandbox), or, for measuring the
/// loop itself, anything else that says what became of a job.
pub trait Runner: Send + Sync + 'static {
    fn process(&self, job: &Job, attempt: u32) -> impl std::future::Future<Output = Verdict>;
}

impl Runner for Worker {
    fn process(&self, job: &Job, attempt: u32) -> impl std::future::Future<Output = Verdict> {
        Worker::process(self, job, attempt)
    }
}

/// How the loop runs.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    /// This worker's name in the queue (host and pid).
    pub worker_id: String,
    /// How long a lease lasts without renewal; it is renewed every third of that.
    pub lease_for: Duration,
    pub concurrency: u32,
    /// Stop once the queue has nothing open (for `--until-empty` and tests); otherwise run until
    /// killed.
    pub until_empty: bool,
    /// How long an idle slot waits before asking the queue again.
    pub poll: Duration,
    /// `PI_ON_FAILURE`.
    pub on_failure: Option<PathBuf>,
}

/// What the loop did.
#[derive(Debug, Default)]
pub struct Summary {
    pub records: AtomicUsize,
    pub retries: AtomicUsize,
}

/// The queued job, when its payload is one (and for the id it was queued under).
fn job_of(id: &str, payload: &str) -> Option<Job> {
    serde_json::from_str::<Job>(payload)
        .ok()
        .filter(|j| j.id == id)
}

/// A job that holds only its id, for the record of a payload that is not a job.
fn stub(id: &str) -> Job {
    Job::new(id, "unknown", "unknown")
}

/// Runs the loop; returns when `until_empty` and nothing is open.
pub fn run<R: Runner>(
    worker: Arc<R>,
    queue: Arc<dyn Queue>,
    records: Arc<Records>,
    options: &LoopOptions,
) -> Arc<Summary> {
    let summary = Arc::new(Summary::default());
    let slots: Vec<_> = (0..options.concurrency.max(1))
        .map(|slot| {
            let (worker, queue, records, summary) = (
                worker.clone(),
                queue.clone(),
                records.clone(),
                summary.clone(),
            );
            let options = options.clone();
            std::thread::spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    log("worker_slot_failed", serde_json::json!({"slot": slot}));
                    return;
                };
                runtime.block_on(slot_loop(&*worker, &*queue, &records, &options, &summary));
            })
        })
        .collect();
    for slot in slots {
        let _ = slot.join();
    }
    summary
}

async fn slot_loop<R: Runner>(
    worker: &R,
    queue: &dyn Queue,
    records: &Records,
    options: &LoopOptions,
    summary: &Summary,
) {
    loop {
        let now = SystemTime::now();
        match queue.take_lost(now) {
            Ok(lost) => {
                for l in lost {
                    let job = job_of(&l.job_id, &l.payload).unwrap_or_else(|| stub(&l.job_id));
                    let mut record = Record::new(
                        &job,
                        Outcome::Failed,
                        Some(reasons::WORKER_LOST),
                        l.attempt,
                        now_ms(),
                    );
                    record.budget_reserved = true;
                    settle_record(records, &record, options, summary);
                }
            }
            Err(e) => log("queue_error", serde_json::json!({"detail": e.to_string()})),
        }
        let lease = match queue.lease(&options.worker_id, options.lease_for, now) {
            Ok(l) => l,
            Err(e) => {
                log("queue_error", serde_json::json!({"detail": e.to_string()}));
                None
            }
        };
        let Some(lease) = lease else {
            if options.until_empty && nothing_open(queue) {
                return;
            }
            tokio::time::sleep(options.poll).await;
            continue;
        };
        run_one(worker, queue, records, options, summary, &lease).await;
    }
}

fn nothing_open(queue: &dyn Queue) -> bool {
    queue
        .status(SystemTime::now(), 0)
        .is_ok_and(|s| s.open.is_empty())
}

async fn run_one<R: Runner>(
    worker: &R,
    queue: &dyn Queue,
    records: &Records,
    options: &LoopOptions,
    summary: &Summary,
    lease: &Lease,
) {
    let job = match job_of(&lease.job_id, &lease.payload) {
        Some(job) => job,
        None => {
            let record = Record::new(
                &stub(&lease.job_id),
                Outcome::Policy,
                Some(reasons::JOB_UNREADABLE),
                lease.attempt,
                now_ms(),
            );
            settle_record(records, &record, options, summary);
            let _ = queue.finish(lease, SystemTime::now());
            return;
        }
    };
    // The lease is renewed while the job runs.
    let renewing = async {
        loop {
            tokio::time::sleep(options.lease_for / 3).await;
            match queue.renew(lease, options.lease_for, SystemTime::now()) {
                Ok(true) => {}
                Ok(false) => {
                    log("lease_lost", serde_json::json!({"jobId": lease.job_id}));
                    return;
                }
                Err(e) => log("queue_error", serde_json::json!({"detail": e.to_string()})),
            }
        }
    };
    let verdict = tokio::select! {
        v = worker.process(&job, lease.attempt) => v,
        // The job is someone else's now (this worker was away past its lease): dropping the run
        // ends its sandbox, and the slot goes on with the next job.
        () = renewing => return,
    };
    let mut record = match verdict {
        Verdict::Done(record) => record,
        Verdict::Retry(record) => match queue.retry(lease, SystemTime::now()) {
            Ok(RetryDecision::Requeued { .. }) => {
                summary.retries.fetch_add(1, Ordering::Relaxed);
                log(
                    "job_retried",
                    serde_json::json!({"jobId": job.id, "attempt": lease.attempt, "reason": record.reason}),
                );
                return;
            }
            Ok(RetryDecision::NotHeld) => return,
            Ok(RetryDecision::Exhausted) => {
                let mut r = record;
                r.outcome = Outcome::Failed;
                r.queued_at_ms = Some(unix_ms(lease.queued_at));
                write_record(records, &r, summary);
                page(&r, options);
                return;
            }
            Err(e) => {
                log("queue_error", serde_json::json!({"detail": e.to_string()}));
                return;
            }
        },
    };
    record.queued_at_ms = Some(unix_ms(lease.queued_at));
    // The record first (a crash after it runs the job again, and the second record is not
    // written), then the job done, and only then the page, which may take a while.
    write_record(records, &record, summary);
    if let Err(e) = queue.finish(lease, SystemTime::now()) {
        log("queue_error", serde_json::json!({"detail": e.to_string()}));
    }
    page(&record, options);
}

/// Writes the record (once); a record that exists already is left as it is.
fn write_record(records: &Records, record: &Record, summary: &Summary) {
    match records.write(record) {
        Ok(true) => {
            summary.records.fetch_add(1, Ordering::Relaxed);
            log(
                "job_recorded",
                serde_json::json!({"jobId": record.job_id, "outcome": record.outcome.as_str(),
                    "reason": record.reason, "attempt": record.attempt}),
            );
        }
        Ok(false) => log(
            "job_already_recorded",
            serde_json::json!({"jobId": record.job_id}),
        ),
        Err(e) => log(
            "record_failed",
            serde_json::json!({"jobId": record.job_id, "detail": e.to_string()}),
        ),
    }
}

/// Runs `PI_ON_FAILURE` for a stop that cost something (also when its record could not be
/// written: the page is how the operator hears of it).
fn page(record: &Record, options: &LoopOptions) {
    if let Some(program) = &options.on_failure
        && record.budget_reserved
        && record.outcome != Outcome::Completed
    {
        on_failure(program, record);
    }
}

/// A lost job's record and page.
fn settle_record(records: &Records, record: &Record, options: &LoopOptions, summary: &Summary) {
    write_record(records, record, summary);
    page(record, options);
}

/// `PROGRAM JOB_ID OUTCOME REASON HOST`, with the worker's environment, its output discarded,
/// at most 30 s.
fn on_failure(program: &std::path::Path, record: &Record) {
    let reason = record
        .reason
        .as_deref()
        .filter(|r| {
            r.len() <= 40
                && r.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
        .unwrap_or(reasons::RUNNER_REASON_UNKNOWN);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let mut command = std::process::Command::new(program);
    command
        .args([&record.job_id, record.outcome.as_str(), reason, &host])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let child = config::spawn::retry_busy(|| command.spawn());
    let Ok(mut child) = child else {
        log(
            "on_failure_failed",
            serde_json::json!({"jobId": record.job_id}),
        );
        return;
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Queues the jobs of cron triggers as they come due, reading `triggers.json` each tick, until the
/// process ends. The first window starts now: firings missed while no worker ran are not made up.
pub fn run_cron(settings: &config::settings::Settings, queue: &dyn Queue, tick: Duration) {
    let mut from = chrono::Utc::now();
    let mut refused_logged = false;
    loop {
        std::thread::sleep(tick);
        let to = chrono::Utc::now();
        let window = (from, to);
        // The next window starts here whatever happens to this one: missed firings are not made up.
        from = to;
        let Ok(bytes) =
            config::files::read_file(&settings.triggers_file, config::triggers::MAX_FILE_BYTES)
        else {
            continue;
        };
        let Ok(all) = config::triggers::parse_triggers(&bytes) else {
            if !refused_logged {
                log("cron_triggers_refused", serde_json::json!({}));
                refused_logged = true;
            }
            continue;
        };
        refused_logged = false;
        let (schedules, refused) = crate::cron::schedules(&all.triggers);
        for (index, id) in refused {
            log(
                "cron_pattern_refused",
                serde_json::json!({"triggerIndex": index, "id": id}),
            );
        }
        for schedule in &schedules {
            // At most one firing per tick and trigger: a clock jump does not queue a burst.
            for at in schedule.firings(window.0, window.1, 1) {
                let id = crate::cron::job_id(&schedule.id, at);
                let job = Job::from_trigger(id.clone(), &schedule.trigger);
                let Ok(payload) = serde_json::to_string(&job) else {
                    continue;
                };
                match queue.enqueue(&id, &payload, SystemTime::now()) {
                    Ok(true) => log(
                        "cron_queued",
                        serde_json::json!({"jobId": id, "triggerIndex": schedule.trigger.index}),
                    ),
                    Ok(false) => {}
                    Err(e) => log("queue_error", serde_json::json!({"detail": e.to_string()})),
                }
            }
        }
    }
}
