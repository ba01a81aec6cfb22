//! The worker's loop: `concurrency` slots, each a thread of its own (bubblewrap dies with the
//! thread that started it, so a slot's thread lives as long as its jobs), each taking a job from
//! the queue, keeping its lease alive while it runs, and settling it: a record and `finish` when it
//! is over, `retry` for an infrastructure fault (the record only once no attempt is left). A record
//! is written before the job is marked done, so a worker killed in between runs the job again and
//! the second record is not written (records are written once).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use protocol::admitted::Flow;
use protocol::job::Job;
use protocol::reason::{Outcome, Reason};
use queue::{Lease, LeaseState, Queue, RetryDecision};
use tokio::sync::watch;

use crate::pipeline::Worker;
use crate::verdict::{Ended, StopCause, StopSignal, Verdict, retried};
use records::record::{Draft, Record, job_of, now_ms, stub, unix_ms};
use records::store::Records;

/// What runs a leased job: the real [`Worker`] (admission, secrets, sandbox), or, for measuring
/// the loop itself, anything else that says what became of a job. `stop` says when the job must
/// end early (cancelled, or the worker stopping).
pub trait Runner: Send + Sync + 'static {
    /// Runs `job`, whose record `draft` begins.
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

impl Runner for Worker {
    fn process(
        &self,
        job: &Job,
        draft: Draft,
        stop: StopSignal,
    ) -> impl std::future::Future<Output = Verdict> {
        Worker::process(self, job, draft, stop)
    }

    fn settled(
        &self,
        job: &Job,
        record: &Record,
        flow: Option<Flow>,
    ) -> impl std::future::Future<Output = ()> {
        crate::forge_job::post_comment(&self.forges, job, record, flow)
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
    /// Stops once the queue has nothing open (for `--until-empty` and tests); otherwise run until
    /// told to stop.
    pub until_empty: bool,
    /// How long an idle slot waits before asking the queue again.
    pub poll: Duration,
    /// How often a running job's cancel mark is looked at.
    pub cancel_poll: Duration,
    /// `PI_ON_FAILURE`.
    pub on_failure: Option<PathBuf>,
    /// The room a job needs on the deployment's disk to start; `None` starts jobs whatever the
    /// disk holds.
    pub disk: Option<DiskGate>,
    /// What a settled job's folder keeps; `None` leaves it whole.
    pub retention: Option<crate::retention::Retention>,
    /// The labels the worker takes jobs for (`host:NAME` among them): it takes a job only when it
    /// carries every label the job needs.
    pub labels: Vec<String>,
    /// How the worker tells the queue it is alive; `None`: it does not (a bench).
    pub heartbeat: Option<Heartbeat>,
    /// Whether running jobs are shown live ([`records::live`]).
    pub live: bool,
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

/// The worker's announcements: its card, sent when it starts and every `every`, with the jobs it
/// runs and whether it drains; it leaves the queue's list when it stops.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    pub card: queue::WorkerCard,
    pub every: Duration,
}

/// No job starts while the file system holding `folder` has less than `min_free` bytes free
/// (`PI_DISK_MIN_MB`): the jobs wait in the queue, and the worker says so once.
#[derive(Debug, Clone)]
pub struct DiskGate {
    /// The deployment's state folder.
    pub folder: PathBuf,
    pub min_free: u64,
}

/// What the loop did.
#[derive(Debug, Default)]
pub struct Summary {
    pub records: AtomicUsize,
    pub retries: AtomicUsize,
    pub handed_back: AtomicUsize,
    /// Whether the disk is nearly full now (said once when it becomes so, once when it is not).
    pub disk_full: AtomicBool,
    /// Jobs running now.
    pub running: AtomicUsize,
}

/// Tells the loop to stop: first it drains (takes no new job, lets the running ones finish), then
/// it stops (ends the running ones and hands them back to the queue).
#[derive(Debug, Default)]
pub struct Control {
    draining: AtomicBool,
    stopping: AtomicBool,
}

impl Control {
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn stop(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.stopping.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

/// Runs the loop; returns when `until_empty` and nothing is open, or once `control` has drained
/// or stopped every slot.
pub fn run<R: Runner>(
    worker: Arc<R>,
    queue: Arc<dyn Queue>,
    records: Arc<Records>,
    options: &LoopOptions,
    control: Arc<Control>,
) -> Arc<Summary> {
    let summary = Arc::new(Summary::default());
    let (beat_done, beat_stop) = std::sync::mpsc::channel::<()>();
    let beating = options.heartbeat.clone().map(|heartbeat| {
        let (queue, summary, control) = (queue.clone(), summary.clone(), control.clone());
        std::thread::spawn(move || beat(&heartbeat, &*queue, &summary, &control, &beat_stop))
    });
    let slots: Vec<_> = (0..options.concurrency.max(1))
        .map(|slot| {
            let (worker, queue, records, summary, control) = (
                worker.clone(),
                queue.clone(),
                records.clone(),
                summary.clone(),
                control.clone(),
            );
            let options = options.clone();
            std::thread::spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    tracing::error!(event = "worker_slot_failed", slot);
                    return;
                };
                let slot = Slot {
                    queue,
                    records: &records,
                    options: &options,
                    summary: &summary,
                    control: &control,
                };
                runtime.block_on(slot.run(&*worker));
            })
        })
        .collect();
    for slot in slots {
        let _ = slot.join();
    }
    drop(beat_done);
    if let Some(beating) = beating {
        let _ = beating.join();
    }
    summary
}

/// Announces the worker at once and every heartbeat until `stop` closes, then takes it off the
/// queue's list. A queue that fails is said in the log and tried again at the next beat.
fn beat(
    heartbeat: &Heartbeat,
    queue: &dyn Queue,
    summary: &Summary,
    control: &Control,
    stop: &std::sync::mpsc::Receiver<()>,
) {
    let mut said_error = false;
    loop {
        let card = queue::WorkerCard {
            running: u32::try_from(summary.running.load(Ordering::SeqCst)).unwrap_or(u32::MAX),
            draining: control.is_draining(),
            ..heartbeat.card.clone()
        };
        match queue.announce(&card, SystemTime::now()) {
            Ok(()) => said_error = false,
            Err(e) if !said_error => {
                said_error = true;
                queue_error(&e);
            }
            Err(_) => {}
        }
        match stop.recv_timeout(heartbeat.every) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => break,
        }
    }
    if let Err(e) = queue.leave(&heartbeat.card.id) {
        queue_error(&e);
    }
}

/// One slot of the loop: it leases a job, runs it, settles it, and again.
struct Slot<'a> {
    queue: Arc<dyn Queue>,
    records: &'a Records,
    options: &'a LoopOptions,
    summary: &'a Summary,
    control: &'a Control,
}

fn queue_error(e: &queue::QueueError) {
    tracing::error!(event = "queue_error", detail = %e);
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

    async fn run<R: Runner>(&self, worker: &R) {
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
            match self.queue_call(move |q| q.take_lost(now)).await {
                Ok(lost) => {
                    for l in lost {
                        let job = job_of(&l.job_id, &l.payload).unwrap_or_else(|| stub(&l.job_id));
                        let reason = if l.cancelled {
                            Reason::Cancelled
                        } else {
                            Reason::WorkerLost
                        };
                        let mut record = Record::ended(&job, reason, l.attempt, now_ms());
                        // A job that was never leased spent nothing: a newer job of its issue
                        // replaced it while it was queued.
                        record.budget_reserved = l.attempt > 0;
                        if l.cancelled && l.attempt == 0 {
                            record = record.with_detail(
                                protocol::detail::Detail::new(
                                    "a newer job for the same issue replaced it before it started (\"sameIssue\": \"cancel-older\")",
                                ),
                                reason.fix(),
                            );
                        }
                        self.settle_record(&record);
                    }
                }
                Err(e) => queue_error(&e),
            }
            let (worker_id, lease_for) = (self.options.worker_id.clone(), self.options.lease_for);
            let labels = self.options.labels.clone();
            let lease = match self
                .queue_call(move |q| q.lease_as(&worker_id, &labels, lease_for, now))
                .await
            {
                Ok(l) => l,
                Err(e) => {
                    queue_error(&e);
                    None
                }
            };
            let Some(lease) = lease else {
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

    async fn retry(&self, lease: &Lease) -> Result<RetryDecision, queue::QueueError> {
        let l = lease.clone();
        self.queue_call(move |q| q.retry(&l, SystemTime::now()))
            .await
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

    async fn run_one<R: Runner>(&self, worker: &R, lease: &Lease) {
        let options = self.options;
        let job = match job_of(&lease.job_id, &lease.payload) {
            Some(job) => job,
            None => {
                let record = Record::ended(
                    &stub(&lease.job_id),
                    Reason::JobUnreadable,
                    lease.attempt,
                    now_ms(),
                );
                self.settle_record(&record);
                let l = lease.clone();
                let _ = self
                    .queue_call(move |q| q.finish(&l, SystemTime::now()))
                    .await;
                return;
            }
        };
        // The lease is renewed while the job runs.
        let renewing = async {
            loop {
                tokio::time::sleep(options.lease_for / 3).await;
                let (l, lease_for) = (lease.clone(), options.lease_for);
                match self
                    .queue_call(move |q| q.renew(&l, lease_for, SystemTime::now()))
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(event = "lease_lost", job_id = %lease.job_id);
                        return;
                    }
                    Err(e) => queue_error(&e),
                }
            }
        };
        // The job is told to stop when the operator cancels it or the worker stops.
        let (tell, stop) = watch::channel(None);
        let watching = async {
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
                tokio::time::sleep(options.cancel_poll).await;
            }
        };
        let mut draft = Draft::new(&job, lease.attempt);
        draft.queued_at(unix_ms(lease.queued_at));
        draft.spent_before(self.earlier_spending(&job.id, lease.attempt));
        let live = options.live.then(|| {
            let feed = records::live::LiveFeed::start(
                self.queue.clone(),
                draft.record_now(),
                &options.worker_id,
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
            () = renewing => return,
            () = watching => return,
        };
        finish.now().await;
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
        match self.retry(lease).await {
            Ok(RetryDecision::Requeued { .. }) => {
                let record = &ended.record;
                self.summary.retries.fetch_add(1, Ordering::Relaxed);
                tracing::info!(event = "job_retried", job_id = %job.id, attempt = lease.attempt,
                    reason = record.reason.map(Reason::as_str));
                if record.budget_reserved {
                    self.write_record(&record.as_earlier_attempt());
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
        let Ended { mut record, flow } = ended;
        self.link_earlier(&mut record);
        self.write_record(&record);
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
        if let Some(retention) = self.options.retention.clone() {
            let pruned =
                tokio::task::spawn_blocking(move || retention.after_job(&record, now_ms()))
                    .await
                    .unwrap_or_default();
            tidied(&job.id, &pruned);
        }
    }

    /// Writes the record (once), naming this worker; a record that exists already is left as it
    /// is.
    fn write_record(&self, record: &Record) {
        let mut record = record.clone();
        record.worker = Some(self.options.worker_id.clone());
        write_record(self.records, &record, Some(self.summary));
    }

    /// The records the job's earlier attempts left, oldest first.
    fn earlier(&self, job_id: &str, attempt: u32) -> Vec<Record> {
        (1..attempt)
            .filter_map(|n| self.records.read(&Record::attempt_id(job_id, n)).ok())
            .collect()
    }

    /// What the job's earlier attempts spent, in USD: attempt `attempt` runs with what they left
    /// of the job's cost cap.
    fn earlier_spending(&self, job_id: &str, attempt: u32) -> f64 {
        self.earlier(job_id, attempt)
            .iter()
            .filter_map(|r| r.cost_usd)
            .sum()
    }

    /// Links the records the job's earlier attempts left (a later attempt's record names them
    /// and counts what they spent).
    fn link_earlier(&self, record: &mut Record) {
        let earlier = self.earlier(&record.job_id, record.attempt);
        *record = record.clone().with_earlier_attempts(earlier);
    }

    /// A lost job's record and page.
    fn settle_record(&self, record: &Record) {
        let mut record = record.clone();
        self.link_earlier(&mut record);
        let record = &record;
        self.write_record(record);
        page(record, self.options);
    }
}

/// Writes the record (once), counted in `summary` when it is written now.
pub fn write_record(records: &Records, record: &Record, summary: Option<&Summary>) {
    if records::store::write_logged(records, record)
        && let Some(summary) = summary
    {
        summary.records.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `PI_ON_FAILURE` for a stop that cost something (also when its record could not be
/// written: the page is how the operator hears of it).
fn page(record: &Record, options: &LoopOptions) {
    if let Some(program) = &options.on_failure
        && record.budget_reserved
        && !matches!(record.outcome, Outcome::Completed | Outcome::Cancelled)
    {
        let reason = record.reason.unwrap_or(Reason::RunnerReasonUnknown);
        on_failure(program, &record.job_id, record.outcome, reason);
    }
}

/// `PROGRAM JOB_ID OUTCOME REASON HOST` (`-` for the job of a page about the worker itself), with
/// the worker's environment, its output discarded, at most 30 s.
fn on_failure(program: &std::path::Path, job_id: &str, outcome: Outcome, reason: Reason) {
    // Every token is plain (`^[a-z0-9-]{1,40}$`, tested with the reasons).
    let host = egress::proxy::host_name();
    let mut command = std::process::Command::new(program);
    command
        .args([job_id, outcome.as_str(), reason.as_str(), &host])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let child = spawn::retry_busy(|| command.spawn());
    let Ok(mut child) = child else {
        tracing::warn!(event = "on_failure_failed", job_id = %job_id);
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
pub fn run_cron(
    settings: &config::settings::Settings,
    queue: &dyn Queue,
    tick: Duration,
    control: &Control,
) {
    let mut from = chrono::Utc::now();
    // What was last said about the file, so a refusal is logged once until it changes.
    let mut said: Option<String> = None;
    let mut say = |why: Option<String>| {
        if why != said {
            match &why {
                Some(why) => tracing::error!(event = "cron_triggers_refused",
                    file = %settings.triggers_file.display(), why = %why),
                None if said.is_some() => tracing::info!(event = "cron_triggers_read",
                    file = %settings.triggers_file.display()),
                None => {}
            }
            said = why;
        }
    };
    loop {
        std::thread::sleep(tick);
        if control.is_draining() {
            return;
        }
        let to = chrono::Utc::now();
        let window = (from, to);
        // The next window starts here whatever happens to this one: missed firings are not made up.
        from = to;
        let all = match config::triggers::TriggersFile::read(&settings.triggers_file) {
            Ok(all) => all.triggers,
            Err(e) => {
                say(Some(format!("{e}, so no cron trigger fires")));
                continue;
            }
        };
        say(None);
        let (schedules, refused) = crate::cron::schedules(&all.triggers);
        for (index, id) in refused {
            tracing::warn!(event = "cron_pattern_refused", trigger_index = index, id = %id);
        }
        for schedule in &schedules {
            // At most one firing per tick and trigger: a clock jump does not queue a burst.
            for at in schedule.firings(window.0, window.1, 1) {
                let id = crate::cron::job_id(&schedule.id, at);
                let mut job = schedule.trigger.job(id.clone());
                // A local job's folder is on this host: the job is this host's.
                if job.kind() == Some(protocol::job::Kind::Local) {
                    job.host = Some(settings.host_name());
                }
                let Ok(queued) = queue::NewJob::of(&job) else {
                    continue;
                };
                match queue.enqueue_job(&queued, SystemTime::now()) {
                    Ok(true) => tracing::info!(event = "cron_queued", job_id = %id,
                        trigger_index = schedule.trigger.index),
                    Ok(false) => {}
                    Err(e) => queue_error(&e),
                }
            }
        }
    }
}

/// Says what became of a settled job's folder.
fn tidied(job_id: &str, pruned: &crate::retention::Pruned) {
    if pruned.folders > 0 {
        tracing::info!(event = "job_folder_tidied", job_id, bytes = pruned.bytes);
    }
    for (path, kind) in &pruned.failed {
        tracing::warn!(event = "job_folder_not_tidied", job_id, path = %path.display(),
        why = ?kind);
    }
}

/// One retention pass every `every`, on a thread of its own, until the worker drains: bounded
/// work each time, so a pass never holds the store long.
pub fn run_retention(
    retention: &crate::retention::Retention,
    records: &Records,
    queue: &dyn Queue,
    every: Duration,
    control: &Control,
) {
    loop {
        match retention.pass(
            records,
            queue,
            now_ms(),
            crate::retention::Budget::default(),
            false,
        ) {
            Ok(p) if !p.is_empty() => tracing::info!(
                event = "pruned",
                records = p.records,
                transcripts = p.transcripts,
                folders = p.folders,
                bytes = p.bytes,
                done_jobs = p.done_jobs
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(event = "prune_failed", detail = %e),
        }
        let until = std::time::Instant::now() + every;
        while std::time::Instant::now() < until {
            if control.is_draining() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1).min(every));
        }
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
