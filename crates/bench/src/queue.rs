//! The worker's job queue (`--queue`): jobs enqueued one by one into a fresh SQLite queue, then
//! drained by worker threads, each with its own handle on the file, leasing and finishing with a
//! runner that does nothing. Every job must be finished exactly once, or the bench fails.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, ensure};
use queue::{Queue, SqliteQueue};
use serde_json::{Value, json};

/// Long enough that no lease lapses during the drain.
const LEASE: Duration = Duration::from_secs(600);

pub struct QueueFigures {
    jobs: usize,
    payload_bytes: usize,
    enqueue: Duration,
    drain: Duration,
    /// Jobs each worker finished.
    per_worker: Vec<usize>,
}

/// Enqueues `jobs` (id, payload) in order, each now; how long that took.
pub fn enqueue_all(queue: &dyn Queue, jobs: &[(String, String)]) -> anyhow::Result<Duration> {
    let start = Instant::now();
    for (id, payload) in jobs {
        ensure!(
            queue.enqueue(id, payload, SystemTime::now())?,
            "job {id} was not added"
        );
    }
    Ok(start.elapsed())
}

/// Enqueues `jobs` (id, payload) in order, then drains them with `workers` threads.
pub fn measure(jobs: &[(String, String)], workers: u32) -> anyhow::Result<QueueFigures> {
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let path = dir.path().join("state/queue.sqlite3");
    let queue = SqliteQueue::open(&path)?;
    let enqueue = enqueue_all(&queue, jobs)?;

    let handles = (0..workers)
        .map(|_| SqliteQueue::open(&path))
        .collect::<Result<Vec<_>, _>>()?;
    let start = Instant::now();
    let finished = std::thread::scope(|scope| {
        let threads: Vec<_> = handles
            .into_iter()
            .enumerate()
            .map(|(w, queue)| scope.spawn(move || drain(&queue, &format!("bench-{w}"))))
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a worker panicked")))
            })
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let drain = start.elapsed();

    let mut times: HashMap<&str, usize> = HashMap::new();
    for id in finished.iter().flatten() {
        *times.entry(id).or_default() += 1;
    }
    let missing = jobs
        .iter()
        .filter(|(id, _)| !times.contains_key(&**id))
        .count();
    let twice = times.values().filter(|&&n| n > 1).count();
    ensure!(
        missing == 0 && twice == 0 && times.len() == jobs.len(),
        "the drain lost {missing} jobs, finished {twice} more than once, and finished {} distinct \
         jobs of {}",
        times.len(),
        jobs.len()
    );
    let status = queue.status(SystemTime::now(), 0)?;
    ensure!(
        status.open.is_empty() && status.counts.done == jobs.len(),
        "the queue holds {} open jobs and {} done after the drain",
        status.open.len(),
        status.counts.done
    );
    Ok(QueueFigures {
        jobs: jobs.len(),
        payload_bytes: jobs.first().map_or(0, |(_, p)| p.len()),
        enqueue,
        drain,
        per_worker: finished.iter().map(Vec::len).collect(),
    })
}

/// One worker: lease, run nothing, finish, until the queue is empty.
fn drain(queue: &SqliteQueue, name: &str) -> anyhow::Result<Vec<String>> {
    let mut finished = Vec::new();
    while let Some(lease) = queue.lease(name, LEASE, SystemTime::now())? {
        black_box(&lease.payload);
        ensure!(
            queue.finish(&lease, SystemTime::now())?,
            "{name} lost its lease on {}",
            lease.job_id
        );
        finished.push(lease.job_id);
    }
    Ok(finished)
}

impl QueueFigures {
    fn rate(&self, d: Duration) -> f64 {
        self.jobs as f64 / d.as_secs_f64()
    }

    pub fn json(&self) -> Value {
        json!({
            "jobs": self.jobs,
            "workers": self.per_worker.len(),
            "payload_bytes": self.payload_bytes,
            "enqueue_ms": (self.enqueue.as_secs_f64() * 1e3).round(),
            "enqueue_jobs_per_s": self.rate(self.enqueue).round(),
            "drain_ms": (self.drain.as_secs_f64() * 1e3).round(),
            "drain_jobs_per_s": self.rate(self.drain).round(),
            "per_worker": self.per_worker,
            "each_finished_once": true,
        })
    }

    pub fn print(&self) {
        println!(
            "queue: {} jobs of {} bytes enqueued in {:.0} ms ({:.0} jobs/s); drained by {} workers \
             (lease, no-op, finish) in {:.0} ms ({:.0} jobs/s; per worker {:?}); each finished once",
            self.jobs,
            self.payload_bytes,
            self.enqueue.as_secs_f64() * 1e3,
            self.rate(self.enqueue),
            self.per_worker.len(),
            self.drain.as_secs_f64() * 1e3,
            self.rate(self.drain),
            self.per_worker,
        );
    }
}

/// The worker's own loop (`worker::service::run`) draining the same jobs with a runner that does
/// nothing but complete each job: leases, lease renewal, records written once, `finish`. Every job
/// must end with exactly one record and the queue with nothing open, or the bench fails.
pub struct ServiceFigures {
    jobs: usize,
    slots: u32,
    drain: Duration,
}

/// Completes every job at once.
struct Trivial;

impl worker::service::Runner for Trivial {
    async fn process(
        &self,
        job: &protocol::job::Job,
        draft: records::record::Draft,
        _stop: worker::verdict::StopSignal,
    ) -> worker::verdict::Verdict {
        worker::verdict::Verdict::from(records::record::Record::new(
            job,
            records::record::Outcome::Completed,
            None,
            draft.attempt(),
            records::record::now_ms(),
        ))
    }
}

pub fn measure_service(jobs: &[(String, String)], slots: u32) -> anyhow::Result<ServiceFigures> {
    use std::sync::Arc;
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let queue = SqliteQueue::open(&dir.path().join("state/queue.sqlite3"))?;
    for (id, payload) in jobs {
        ensure!(
            queue.enqueue(id, payload, SystemTime::now())?,
            "job {id} was not added"
        );
    }

    let records = Arc::new(records::store::Records::sqlite(&queue::sqlite_path(
        dir.path(),
    ))?);
    let options = worker::service::LoopOptions {
        worker_id: "bench".to_owned(),
        lease_for: LEASE,
        concurrency: slots,
        until_empty: true,
        poll: Duration::from_millis(10),
        cancel_poll: Duration::from_millis(500),
        on_failure: None,
        disk: None,
        retention: None,
        labels: Vec::new(),
        heartbeat: None,
        live: false,
    };
    let start = Instant::now();
    let summary = worker::service::run(
        Arc::new(Trivial),
        Arc::new(queue),
        records.clone(),
        &options,
        Arc::new(worker::service::Control::default()),
    );
    let drain = start.elapsed();
    let written = records.list()?.records;
    let mut ids: Vec<&str> = written.iter().map(|r| r.job_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let expected = jobs.len();
    ensure!(
        written.len() == expected
            && ids.len() == expected
            && summary.records.load(std::sync::atomic::Ordering::Relaxed) == expected
            && jobs
                .iter()
                .all(|(id, _)| ids.binary_search(&id.as_str()).is_ok()),
        "the worker's loop wrote {} records for {} distinct jobs of {expected}",
        written.len(),
        ids.len()
    );
    let status =
        SqliteQueue::open(&dir.path().join("state/queue.sqlite3"))?.status(SystemTime::now(), 0)?;
    ensure!(
        status.open.is_empty() && status.counts.done == expected,
        "the queue holds {} open jobs after the worker's loop",
        status.open.len()
    );
    Ok(ServiceFigures {
        jobs: expected,
        slots,
        drain,
    })
}

impl ServiceFigures {
    pub fn json(&self) -> Value {
        json!({
            "jobs": self.jobs,
            "slots": self.slots,
            "drain_ms": (self.drain.as_secs_f64() * 1e3).round(),
            "drain_jobs_per_s": (self.jobs as f64 / self.drain.as_secs_f64()).round(),
            "one_record_each": true,
        })
    }

    pub fn print(&self) {
        println!(
            "worker loop: {} jobs drained by {} slots (lease, trivial runner, record, finish) in {:.0} ms ({:.0} jobs/s); one record each, nothing left open",
            self.jobs,
            self.slots,
            self.drain.as_secs_f64() * 1e3,
            self.jobs as f64 / self.drain.as_secs_f64(),
        );
    }
}
