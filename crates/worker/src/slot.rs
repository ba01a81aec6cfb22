//! One slot of the worker's loop, at both ends of the job's path: it leases a job, begins its
//! record ([`Draft`]), keeps the lease alive and watches for a stop while the pipeline runs the
//! job, and settles what became of it: handed back, queued again, or recorded (its record first,
//! then the job done, then its comment, page and tidy). Every call of the queue and of the
//! record store runs on the blocking pool, never on the slot's own loop.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use protocol::admitted::Flow;
use protocol::job::Job;
use protocol::reason::{Outcome, Reason};
use queue::{Lease, LeaseState, Queue, RetryDecision};
use records::record::{Draft, Record, job_of, now_ms, unix_ms};
use records::store::Records;
use tokio::sync::watch;

use crate::control::{Control, queue_error};
use crate::lost::{lost_record, unreadable_record};
use crate::options::{LoopOptions, Summary};
use crate::page::{on_failure, page};
use crate::verdict::{Ended, StopCause, StopSignal, Verdict, retried};

/// What runs a leased job: the real worker (`pipeline::Worker`: admission, secrets, sandbox), or,
/// for measuring the loop itself, anything else that says what became of a job. `stop` says when
/// the job must end early (cancelled, or the worker stopping).
pub trait Runner: Send + Sync + 'static {
    /// Runs `job`, whose record `draft` begins (naming this worker, when the queue leased it
    /// the job, and what its earlier attempts spent).
    fn process(
        &self,
        job: &Job,
        draft: Draft,
        stop: StopSignal,
    ) -> impl std::future::Future<Output = Verdict>;

    /// Once the job's record is final (written, and no attempt follows): a forge job's comment,
    /// by its record and its plan's `flow`.
    fn settled(
        &self,
        job: &Job,
        record: &Record,
        flow: Option<Flow>,
    ) -> impl std::future::Future<Output = ()> {
        let _ = (job, record, flow);
        async {}
    }
}

/// One slot of the loop: it leases a job, runs it, settles it, and again.
pub(crate) struct Slot<'a> {
    pub queue: Arc<dyn Queue>,
    pub records: Arc<Records>,
    pub options: &'a LoopOptions,
    pub summary: &'a Summary,
    pub control: &'a Control,
}

/// Ends a job's live view when dropped (a job this worker let go of), or at once ([`Finish::now`],
/// before the job's record is written).
struct Finish(Option<Arc<records::live::LiveFeed>>);

impl Finish {
    /// Ends the view with its last lines written, off the async loop (it writes to the queue).
    async fn now(mut self) {
        if let Some(feed) = self.0.take() {
            let _ = tokio::task::spawn_blocking(move || feed.finish()).await;
        }
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        if let Some(feed) = &self.0 {
            feed.finish();
        }
    }
}

impl Slot<'_> {
    /// Runs one call of the queue on a thread of the blocking pool, never on the slot's own loop:
    /// that loop also reads the running job's output, renews its lease and watches for a cancel,
    /// and a queue that answers slowly (a Redis reconnecting through an outage) must not hold them
    /// up.
    async fn queue_call<T: Send + 'static>(
        &self,
        call: impl FnOnce(&dyn Queue) -> T + Send + 'static,
    ) -> T {
        let queue = self.queue.clone();
        match tokio::task::spawn_blocking(move || call(&*queue)).await {
            Ok(answer) => answer,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// Runs one call of the record store as [`Slot::queue_call`] runs the queue's: the store is
    /// the queue's (SQLite or Redis), as slow at times.
    async fn records_call<T: Send + 'static>(
        &self,
        call: impl FnOnce(&Records) -> T + Send + 'static,
    ) -> T {
        let records = self.records.clone();
        match tokio::task::spawn_blocking(move || call(&records)).await {
            Ok(answer) => answer,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    pub(crate) async fn run<R: Runner>(&self, worker: &R) {
        loop {
            if self.control.is_draining() {
                return;
            }
            // A nearly full disk starts no job: the jobs wait in the queue (a worker that is to
            // stop once it is empty stops, leaving them there).
            if !self.room_for_a_job() {
                if self.options.until_empty {
                    return;
                }
                tokio::time::sleep(self.options.poll).await;
                continue;
            }
            let now = SystemTime::now();
            self.settle_lost(now).await;
            let Some(lease) = self.lease(now).await else {
                if self.options.until_empty && self.nothing_open().await {
                    return;
                }
                tokio::time::sleep(self.options.poll).await;
                continue;
            };
            self.summary.running.fetch_add(1, Ordering::SeqCst);
            self.run_one(worker, &lease).await;
            self.summary.running.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The jobs the queue found lost, each recorded and paged.
    async fn settle_lost(&self, now: SystemTime) {
        match self.queue_call(move |q| q.take_lost(now)).await {
            Ok(lost) => {
                for l in lost {
                    self.settle_record(lost_record(&l, &self.options.worker_id))
                        .await;
                }
            }
            Err(e) => queue_error(&e),
        }
    }

    /// A job this worker can take, leased to it; `None` when there is none (or the queue fails).
    async fn lease(&self, now: SystemTime) -> Option<Lease> {
        let (worker_id, lease_for) = (self.options.worker_id.clone(), self.options.lease_for);
        let labels = self.options.labels.clone();
        self.queue_call(move |q| q.lease_as(&worker_id, &labels, lease_for, now))
            .await
            .unwrap_or_else(|e| {
                queue_error(&e);
                None
            })
    }

    /// Whether the deployment's disk has room for a job to start. The worker says it once when the
    /// disk becomes nearly full (a warning and a page, reason `disk-nearly-full`) and once when
    /// there is room again. A disk whose room cannot be read is not held against the jobs.
    fn room_for_a_job(&self) -> bool {
        let Some(gate) = &self.options.disk else {
            return true;
        };
        let free = match config::files::free_bytes(&gate.folder) {
            Ok(free) => free,
            Err(_) => return true,
        };
        let full = free < gate.min_free;
        let was = self.summary.disk_full.swap(full, Ordering::SeqCst);
        let reason = Reason::DiskNearlyFull;
        match (was, full) {
            (false, true) => {
                tracing::warn!(event = "disk_nearly_full", reason = %reason,
                    free_mb = free >> 20, min_mb = gate.min_free >> 20,
                    setting = config::settings::DISK_MIN_SETTING, fix = reason.fix());
                if let Some(program) = &self.options.on_failure {
                    on_failure(program, "-", Outcome::Failed, reason);
                }
            }
            (true, false) => {
                tracing::info!(event = "disk_room_again", free_mb = free >> 20);
            }
            _ => {}
        }
        !full
    }

    /// Whether nothing is open that this worker could take (a job that needs a label it lacks is
    /// another worker's).
    async fn nothing_open(&self) -> bool {
        let labels = self.options.labels.clone();
        self.queue_call(move |q| q.status(SystemTime::now(), 0))
            .await
            .is_ok_and(|s| {
                !s.open
                    .iter()
                    .any(|j| j.needs.iter().all(|n| labels.contains(n)))
            })
    }

    /// Runs the leased job to its verdict, then settles it.
    async fn run_one<R: Runner>(&self, worker: &R, lease: &Lease) {
        let Some(job) = job_of(&lease.job_id, &lease.payload) else {
            self.settle_record(unreadable_record(lease, &self.options.worker_id))
                .await;
            let l = lease.clone();
            let _ = self
                .queue_call(move |q| q.finish(&l, SystemTime::now()))
                .await;
            return;
        };
        // The job is told to stop when the operator cancels it or the worker stops.
        let (tell, stop) = watch::channel(None);
        let mut draft = self.draft(&job, lease).await;
        let live = self.options.live.then(|| {
            let feed = records::live::LiveFeed::start(
                self.queue.clone(),
                draft.record_now(),
                &self.options.worker_id,
            );
            draft.show_live(feed.clone() as Arc<dyn records::record::Watched>);
            feed
        });
        // However the job ends, its view has its last lines before its record is written.
        let finish = Finish(live);
        let verdict = tokio::select! {
            v = worker.process(&job, draft, stop) => v,
            // The job is someone else's now (this worker was away past its lease): dropping the run
            // ends its sandbox, and the slot goes on with the next job.
            () = self.renew(lease) => {
                self.tidy_if_over(&lease.job_id).await;
                return;
            }
            () = self.watch(lease, &tell) => return,
        };
        finish.now().await;
        if !self.still_held(lease).await {
            return;
        }
        match verdict {
            Verdict::HandBack => self.hand_back(lease).await,
            Verdict::Ended(ended) if retried(&ended.record) => {
                self.retry_or_record(worker, &job, lease, *ended).await;
            }
            Verdict::Ended(ended) => {
                self.record_final(worker, &job, Some(lease), *ended).await;
            }
        }
    }

    /// The record of the leased job begun: what it is, who runs it, when it was queued and what
    /// its earlier attempts spent.
    async fn draft(&self, job: &Job, lease: &Lease) -> Draft {
        let mut draft = Draft::new(job, lease.attempt);
        draft.written_by(&self.options.worker_id);
        draft.queued_at(unix_ms(lease.queued_at));
        let earlier = self.earlier(&job.id, lease.attempt).await;
        draft.spent_before(earlier.iter().filter_map(|r| r.cost_usd).sum());
        draft
    }

    /// Renews the lease while the job runs; returns once the lease is lost: taken by another
    /// worker, or not confirmed by the queue for as long as a lease lasts (the queue away, or
    /// this worker suspended), since another worker may then have taken the job: the job is
    /// never run by two workers at once, and is run again once its lease has lapsed.
    async fn renew(&self, lease: &Lease) {
        let lease_for = self.options.lease_for;
        let mut confirmed = std::time::Instant::now();
        loop {
            tokio::time::sleep(lease_for / 3).await;
            let l = lease.clone();
            let left = lease_for.saturating_sub(confirmed.elapsed());
            let call = self.queue_call(move |q| q.renew(&l, lease_for, SystemTime::now()));
            let why = match tokio::time::timeout(left, call).await {
                Ok(Ok(true)) => {
                    confirmed = std::time::Instant::now();
                    continue;
                }
                Ok(Ok(false)) => "another worker holds it",
                Ok(Err(e)) => {
                    queue_error(&e);
                    if confirmed.elapsed() < lease_for {
                        continue;
                    }
                    "the queue did not confirm it for as long as it lasts"
                }
                Err(_) => "the queue did not confirm it for as long as it lasts",
            };
            tracing::warn!(event = "lease_lost", job_id = %lease.job_id, why);
            return;
        }
    }

    /// Whether the lease is still this worker's, as the queue says now (a queue that cannot be
    /// asked leaves it so: the record's write then waits for the queue).
    async fn still_held(&self, lease: &Lease) -> bool {
        let (l, lease_for) = (lease.clone(), self.options.lease_for);
        match self
            .queue_call(move |q| q.renew(&l, lease_for, SystemTime::now()))
            .await
        {
            Ok(false) => {
                tracing::warn!(event = "lease_lost", job_id = %lease.job_id,
                    why = "another worker holds it: the job's end is not recorded here");
                false
            }
            Ok(true) | Err(_) => true,
        }
    }

    /// Tells the job to stop when the worker stops or the operator cancels it; never returns.
    async fn watch(&self, lease: &Lease, tell: &watch::Sender<Option<StopCause>>) {
        loop {
            if self.control.is_stopping() {
                let _ = tell.send(Some(StopCause::Shutdown));
            } else {
                let l = lease.clone();
                let state = self.queue_call(move |q| q.lease_state(&l)).await;
                if matches!(state, Ok(LeaseState::CancelRequested)) {
                    let _ = tell.send(Some(StopCause::Cancelled));
                }
            }
            tokio::time::sleep(self.options.cancel_poll).await;
        }
    }

    /// Gives the job back to the queue, with no record: the worker is stopping.
    async fn hand_back(&self, lease: &Lease) {
        let l = lease.clone();
        match self
            .queue_call(move |q| q.release(&l, SystemTime::now()))
            .await
        {
            Ok(_) => {
                self.summary.handed_back.fetch_add(1, Ordering::Relaxed);
                tracing::info!(event = "job_handed_back", job_id = %lease.job_id, attempt = lease.attempt);
            }
            Err(e) => queue_error(&e),
        }
    }

    /// A job whose reason is retried: queued again while attempts remain (an attempt that ran
    /// keeps its record, which the next one links to), else recorded.
    async fn retry_or_record<R: Runner>(&self, worker: &R, job: &Job, lease: &Lease, ended: Ended) {
        let l = lease.clone();
        let retried = self
            .queue_call(move |q| q.retry(&l, SystemTime::now()))
            .await;
        match retried {
            Ok(RetryDecision::Requeued { .. }) => {
                let record = &ended.record;
                self.summary.retries.fetch_add(1, Ordering::Relaxed);
                tracing::info!(event = "job_retried", job_id = %job.id, attempt = lease.attempt,
                    reason = record.reason.map(Reason::as_str));
                if record.budget_reserved {
                    self.write_record(record.as_earlier_attempt()).await;
                }
            }
            Ok(RetryDecision::NotHeld) => {}
            // The retry left the job done in the queue.
            Ok(RetryDecision::Exhausted) => self.record_final(worker, job, None, ended).await,
            Err(e) => queue_error(&e),
        }
    }

    /// A job that is over: its record first (a crash after it runs the job again, and the second
    /// record is not written), then the job done (`finish`, unless the queue did it), and only then
    /// the comment and the page, which may take a while.
    async fn record_final<R: Runner>(
        &self,
        worker: &R,
        job: &Job,
        finish: Option<&Lease>,
        ended: Ended,
    ) {
        let Ended { record, flow } = ended;
        let record = self.job_record(record).await;
        self.write_record(record.clone()).await;
        if let Some(lease) = finish {
            let l = lease.clone();
            if let Err(e) = self
                .queue_call(move |q| q.finish(&l, SystemTime::now()))
                .await
            {
                queue_error(&e);
            }
        }
        // A worker that dies before the comment loses it, never posts it twice (a second
        // attempt's comment is found by its mark).
        worker.settled(job, &record, flow).await;
        page(&record, self.options);
        self.tidy(record).await;
    }

    /// After a run dropped for its lost lease: if the job has ended elsewhere meanwhile (its
    /// record written by the worker that took it, or as lost), what this run left in its folder
    /// goes as after any job.
    async fn tidy_if_over(&self, job_id: &str) {
        let id = job_id.to_owned();
        if let Ok(record) = self.records_call(move |r| r.read(&id)).await {
            self.tidy(record).await;
        }
    }

    /// Empties the folder of the job `record` ends (but its transcript), as the retention says.
    async fn tidy(&self, record: Record) {
        if let Some(retention) = self.options.retention.clone() {
            let id = record.job_id.clone();
            let pruned =
                tokio::task::spawn_blocking(move || retention.after_job(&record, now_ms()))
                    .await
                    .unwrap_or_default();
            crate::retention::tidied(&id, &pruned);
        }
    }

    /// Writes the record (once; a record that exists already is left as it is), counted when it
    /// is written now.
    async fn write_record(&self, record: Record) {
        let written = self
            .records_call(move |records| records::store::write_logged(records, &record))
            .await;
        if written {
            self.summary.records.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The records the job's earlier attempts left, oldest first.
    async fn earlier(&self, job_id: &str, attempt: u32) -> Vec<Record> {
        let job_id = job_id.to_owned();
        self.records_call(move |records| {
            (1..attempt)
                .filter_map(|n| records.read(&Record::attempt_id(&job_id, n)).ok())
                .collect()
        })
        .await
    }

    /// The job's record: its last attempt's `record`, with the records its earlier attempts left
    /// linked (it names them and counts what they spent).
    async fn job_record(&self, record: Record) -> Record {
        let earlier = self.earlier(&record.job_id, record.attempt).await;
        record.with_earlier_attempts(earlier)
    }

    /// A record no job ran to (a lost job, a payload that is not a job): written and paged.
    async fn settle_record(&self, record: Record) {
        let record = self.job_record(record).await;
        self.write_record(record.clone()).await;
        page(&record, self.options);
        // A job lost with its worker has its folder tidied like any other.
        self.tidy(record).await;
    }
}
