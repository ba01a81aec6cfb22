//! One job, from the queue to its record, in a straight line: the admission decides (every check
//! that costs nothing) and hands over the job's whole plan ([`Admitted`]); from there the worker
//! reads only the plan. The job waits for its repository folder to be free, the secrets its
//! trigger names are resolved on the host, a forge job's token is minted and its repository
//! cloned, the job's folder is written, the sandbox step runs the runner ([`Sandbox`]) and says
//! how the job ended, a completed `fix` job's changes are delivered, and the record is finished
//! once from what the steps returned ([`Draft::finish_at`]).
//!
//! [`Worker::process`] never touches the queue: it says what became of the job ([`Verdict`]) and
//! the worker loop finishes it, retries it (when the record's reason is one the reason table
//! retries), hands it back, or records it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use config::settings::Settings;
use pickup::admission::{Decision, Refusal};
use pickup::fs::Deployment;
use protocol::admitted::{Admitted, Egress, Flow, ForgeTarget, Work};
use protocol::detail::Detail;
use protocol::job::Job;
use protocol::job_dir;
use protocol::reason::Reason;
use sandbox::backend::Backend;
use sandbox::secrets::{Resolver, Secret};

use crate::forge_job::{self, Prepared};
use crate::sandboxed::Sandbox;
use crate::transcript::Redactor;
use crate::verdict::{StopCause, StopSignal, Verdict, stopped};
use records::record::{Draft, EgressDenial, Ending, now_ms};

/// How often a job that waits for its folder looks again.
const LOCK_POLL: Duration = Duration::from_millis(200);

/// What the worker has to run jobs with.
pub struct Worker {
    pub settings: Settings,
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
    /// Where the servers' pins are (the queue's store): `None` holds no server to a pin (every
    /// job is on first use, and nothing is kept).
    pub pins: Option<crate::pins::PinStore>,
    /// `mcp pin`, run by this operator: every job of this worker only connects its servers, and
    /// what they list becomes their pins, by the operator's name. `None` for a worker of jobs.
    pub approving: Option<String>,
}

/// The longest path a unix socket may be bound at (`sun_path`, less its closing NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The `refused_<reason>` log line: names only.
pub fn log_refusal(job_id: &str, refusal: &Refusal) {
    let d = &refusal.detail;
    tracing::warn!(
        event = refusal.reason.log_event(),
        job_id = %job_id,
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

/// The job's folder (the sandbox's `/job`), written fresh in its state folder (a folder left by
/// an earlier attempt is replaced): `prompt.md`, `event.json`, the runner's input and, when the
/// job names servers, `mcp.json`, each read-only. A root worker makes it a small file system of
/// its own ([`JOB_FOLDER_BYTES`]), so that the job's mount table shows `/job` as that, never as
/// the deployment's path with the job's id in it; it is unmounted when the job ends
/// ([`release_job_folder`]).
fn write_job_folder(
    plan: &Admitted,
    prompt: String,
    input: &job_dir::RunnerInput,
) -> std::io::Result<JobFolder> {
    use std::os::unix::fs::PermissionsExt as _;
    let folder = plan.state_dir.join("job");
    release_job_folder(&folder);
    if folder.exists() {
        make_writable(&folder)?;
        std::fs::remove_dir_all(&folder)?;
    }
    std::fs::create_dir_all(&folder)?;
    let guard = JobFolder(folder.clone());
    if rustix::process::geteuid().is_root() {
        let size = std::ffi::CString::new(format!("size={JOB_FOLDER_BYTES},mode=0755"))
            .map_err(std::io::Error::other)?;
        use rustix::mount::MountFlags as F;
        rustix::mount::mount(
            "tmpfs",
            &folder,
            "tmpfs",
            F::NOSUID | F::NODEV | F::NOEXEC,
            Some(size.as_c_str()),
        )?;
    }
    std::fs::set_permissions(&plan.state_dir, std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755))?;
    let event = serde_json::json!({
        "jobId": plan.job_id,
        "kind": plan.kind.as_str(),
        "trigger": plan.trigger_type,
        "flow": plan.flow,
        "event": plan.work.forge().map(|t| &t.event),
    });
    for (name, text) in [
        (job_dir::PROMPT, prompt),
        (job_dir::EVENT, format!("{event:#}\n")),
        (job_dir::RUNNER_INPUT, input.to_text()),
    ] {
        let path = folder.join(name);
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444))?;
    }
    if let Some(file) = &plan.mcp {
        pickup::fs::write_job_mcp(&folder, file)?;
    }
    Ok(guard)
}

/// The job's folder as written: a root worker's file system there is unmounted when this goes,
/// at the job's end or when its run is dropped (its lease lost), or if writing it failed.
struct JobFolder(PathBuf);

impl JobFolder {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for JobFolder {
    fn drop(&mut self) {
        release_job_folder(&self.0);
    }
}

/// What the runner is told beside `mcp.json`: the plan's input with the servers' pins; for an
/// approval (`list_only`), to list the servers and end, withholding nothing.
fn runner_input(
    plan: &Admitted,
    pins: &std::collections::BTreeMap<String, protocol::pins::Listing>,
    list_only: bool,
) -> job_dir::RunnerInput {
    let input = job_dir::RunnerInput {
        pins: pins.clone(),
        ..plan.runner_input()
    };
    if list_only {
        return job_dir::RunnerInput {
            list_only,
            pin_policy: protocol::pins::PinPolicy::Accept,
            ..input
        };
    }
    input
}

/// The size of a root worker's job folder: its prompt, event, runner input and `mcp.json`.
const JOB_FOLDER_BYTES: u64 = 16 << 20;

/// Unmounts the job's folder a root worker mounted (nothing when it is not a mount).
fn release_job_folder(folder: &Path) {
    let _ = rustix::mount::unmount(folder, rustix::mount::UnmountFlags::DETACH);
}

/// A later attempt's cost cap is what the job's earlier attempts left of it, so that a job made to
/// fail and be tried again cannot spend its cap once an attempt; an attempt with nothing left
/// ends before it starts.
fn left_of_cap(plan: &mut Admitted, draft: &Draft) -> Result<(), Verdict> {
    let spent = draft.earlier_spending();
    let Some(cap) = plan.model_rules.max_cost_usd else {
        return Ok(());
    };
    if spent <= 0.0 {
        return Ok(());
    }
    let left = cap - spent;
    if left > 0.0 {
        plan.model_rules.max_cost_usd = Some(left);
        return Ok(());
    }
    let reason = Reason::CostCapReached;
    let why = format!("the job's earlier attempts spent {spent:.6} USD of its cap of {cap} USD");
    tracing::warn!(event = reason.log_event(), job_id = %plan.job_id, why = %why);
    Err(draft
        .finish(Ending::failed(reason, Detail::new(why)))
        .into())
}

/// A forge job's target, with its token and clone.
type Forged<'a> = (&'a ForgeTarget, Prepared);

impl Worker {
    /// Decides, then runs the job. Never panics on what the job holds.
    pub async fn process(&self, job: &Job, mut draft: Draft, stop: StopSignal) -> Verdict {
        // A forge job's record names its issue's web address.
        draft.url(
            job.event
                .as_ref()
                .and_then(|e| self.forges.item_url(e).ok()),
        );
        let mut plan = match self.admit(job, &draft) {
            Ok(plan) => plan,
            Err(verdict) => return verdict,
        };
        // From here on the plan says what a completed job's comment is.
        let flow = plan.work.forge().map(|target| target.flow);
        let verdict = match left_of_cap(&mut plan, &draft) {
            Err(verdict) => verdict,
            Ok(()) => {
                draft.admitted(now_ms());
                self.carry_out(&plan, draft, stop).await
            }
        };
        verdict.with_flow(flow)
    }

    /// The sandbox step, with what this worker runs jobs with.
    fn sandbox(&self) -> Sandbox<'_> {
        Sandbox {
            settings: &self.settings,
            backend: &*self.backend,
            env: &self.env,
            time_limit: self.time_limit,
            runner_stderr: self.runner_stderr,
            cgroups: self.cgroups.as_ref(),
            identities: self.identities.as_ref(),
            disks: self.disks.as_ref(),
        }
    }

    /// The admission (step 1): every check that costs nothing. The job as queued is read here,
    /// and never after.
    fn admit(&self, job: &Job, draft: &Draft) -> Result<Admitted, Verdict> {
        // The App's key as this worker read it: a github job it cannot mint for is refused here,
        // as explain and doctor say.
        let github_key = self
            .settings
            .github_app_key_file
            .as_ref()
            .map(|_| self.forges.github.is_some());
        let decision = Deployment::new(&self.settings, &self.env)
            .with_github_key(github_key)
            .decide(job);
        match decision {
            Decision::Admit(plan) => Ok(*plan),
            Decision::Refuse(refusal) => {
                log_refusal(&job.id, &refusal);
                let ending = Ending::of(refusal.reason)
                    .with_detail(refusal.detail.clone(), refusal.fix.clone());
                Err(draft.finish(ending).into())
            }
            Decision::Retry { detail } => {
                tracing::warn!(event = "pickup_retry", job_id = %job.id, detail = %detail);
                Err(draft
                    .failed(Reason::PickupRetriesSpent, Detail::new(detail))
                    .into())
            }
        }
    }

    /// The plan carried out, step by step; the first step that cannot be taken ends the job.
    async fn carry_out(&self, plan: &Admitted, mut draft: Draft, mut stop: StopSignal) -> Verdict {
        // 2. One job at a time in a repository folder: a second one waits here.
        let _lock = match self.wait_for_folder(plan, &draft, &mut stop).await {
            Ok(lock) => lock,
            Err(verdict) => return verdict,
        };
        // 3. The trigger's secrets, resolved on the host: only values go on.
        let secrets = match self.resolve_secrets(plan, &draft).await {
            Ok(s) => s,
            Err(verdict) => return verdict,
        };
        // Its own folder, made now and held while the worker works in it: a worker of the
        // deployment that starts meanwhile leaves what is mounted in it alone.
        let _held = match sandbox::identity::lock_job_folder(&plan.state_dir, draft.attempt()) {
            Ok(held) => held,
            Err(e) => {
                let why = format!("its lock cannot be taken ({})", e.kind());
                let detail = Detail::new(why).path(plan.state_dir.display().to_string());
                return draft.failed(Reason::JobFolderFailed, detail).into();
            }
        };
        // 4. A forge job's token and clone, and the prompt made from its issue.
        let (prompt, forged) = match &plan.work {
            Work::Task(task) => (task.clone(), None),
            Work::Forge(target) => {
                match forge_job::prepare(&self.forges, plan, target, &draft).await {
                    Ok(p) => (
                        forge_job::prompt(&target.event, target.flow, &p.base),
                        Some((&**target, p)),
                    ),
                    Err(verdict) => return verdict,
                }
            }
        };
        let verdict = self
            .run_prepared(
                plan,
                &mut draft,
                prompt,
                &secrets,
                forged.as_ref(),
                &mut stop,
            )
            .await;
        // Every token minted for the job ends with it: the job's processes are gone, and its
        // delivery had a token of its own.
        if let Some((target, p)) = &forged
            && let Err(e) = self.forges.revoke(&target.event, &p.token).await
        {
            tracing::warn!(event = "forge_revoke_failed", job_id = %plan.job_id, detail = %e);
        }
        verdict
    }

    /// The job's folder, its way out, its sandbox and, for a completed `fix` job, its delivery;
    /// then the record, finished once.
    async fn run_prepared(
        &self,
        plan: &Admitted,
        draft: &mut Draft,
        prompt: String,
        secrets: &[(String, Secret)],
        forged: Option<&Forged<'_>>,
        stop: &mut StopSignal,
    ) -> Verdict {
        let prepared = forged.map(|(_, p)| p);
        let sandbox = self.sandbox();
        // 5. The job's folder, with its servers' pins in the runner's input.
        let pins = match self.read_pins(plan, draft).await {
            Ok(pins) => pins,
            Err(verdict) => return verdict,
        };
        let input = runner_input(plan, &pins, self.approving.is_some());
        let job_dir = match write_job_folder(plan, prompt, &input) {
            Ok(d) => d,
            Err(e) => {
                let why = format!("it cannot be written ({})", e.kind());
                let detail = Detail::new(why).path(plan.state_dir.display().to_string());
                return draft.failed(Reason::JobFolderFailed, detail).into();
            }
        };
        // 6. Its environment: what its processes inherit.
        let env = match sandbox.job_env(plan, draft, secrets, prepared) {
            Ok(env) => env,
            Err(verdict) => return verdict,
        };
        // Every value the job is given that the worker resolved, forwarded or minted: the
        // transcript, the final message and a `fix` job's change never hold one.
        let given = self.given_values(plan, secrets, prepared);
        let redactor = Redactor::new(given.iter().map(|(n, v)| (n.as_str(), v.expose())));
        // 7. With egress on, its way out: its socket to the proxy, in its folder. A job never
        // runs without it.
        let egress = matches!(plan.egress, Egress::On { .. });
        if egress && let Err(verdict) = self.open_egress(draft, job_dir.path()).await {
            return verdict;
        }
        // 8. The sandbox.
        let ran = sandbox
            .run(plan, draft, job_dir.path(), env, &redactor, stop)
            .await;
        // 9. However the job ended: its socket closed, and what the proxy refused it recorded.
        if egress {
            let denied = self.close_egress(draft).await;
            draft.egress_denied(denied);
        }
        drop(job_dir);
        let ending = match ran.and_then(|left| sandbox.ending(draft, left, &redactor)) {
            Ok(ending) => ending,
            Err(verdict) => return verdict,
        };
        self.keep_pins(plan, draft, &pins).await;
        let ended_at = now_ms();
        // 10. A completed fix job's changes, pushed and proposed, none holding a value the job
        // was given.
        let ending = match forged {
            Some((target, p)) if ending.is_completed() && target.flow == Flow::Fix => {
                self.deliver(plan, draft, (target, p), &given, ending).await
            }
            _ => ending,
        };
        draft.finish_at(ending, ended_at).into()
    }

    /// The pins of the job's servers, read from the store off the async loop; a store that
    /// cannot be read fails the job, which is tried again.
    async fn read_pins(
        &self,
        plan: &Admitted,
        draft: &mut Draft,
    ) -> Result<std::collections::BTreeMap<String, protocol::pins::Listing>, Verdict> {
        let Some(store) = self.pins.clone().filter(|_| !plan.servers.is_empty()) else {
            return Ok(Default::default());
        };
        let servers = plan.servers.clone();
        let read = tokio::task::spawn_blocking(move || crate::pins::read(store.as_ref(), &servers))
            .await
            .unwrap_or_else(|e| Err(crate::pins::Unreadable(e.to_string())));
        read.map_err(|crate::pins::Unreadable(why)| {
            draft
                .failed(Reason::PinsUnreadable, Detail::new(why))
                .into()
        })
    }

    /// What the job's servers listed, held to the pins it was given: the record told, and the
    /// store's pins and drift written off the async loop.
    async fn keep_pins(
        &self,
        plan: &Admitted,
        draft: &mut Draft,
        given: &std::collections::BTreeMap<String, protocol::pins::Listing>,
    ) {
        let Some(store) = self.pins.clone() else {
            return;
        };
        let now = std::time::SystemTime::now();
        let writes = match &self.approving {
            Some(who) => crate::pins::approve(draft, given, who, now),
            None => crate::pins::reckon(draft, given, plan.pins, now),
        };
        if writes.is_empty() {
            return;
        }
        let job_id = plan.job_id.clone();
        let _ = tokio::task::spawn_blocking(move || {
            crate::pins::write(store.as_ref(), &job_id, writes, now)
        })
        .await;
    }

    /// A completed `fix` job's delivery: the pull request it proposed put in `draft`, or how the
    /// job ends instead of `ending`.
    async fn deliver(
        &self,
        plan: &Admitted,
        draft: &mut Draft,
        (target, prepared): (&ForgeTarget, &Prepared),
        given: &[(String, Secret)],
        ending: Ending,
    ) -> Ending {
        let limits = forge_job::publish_limits(&self.settings);
        let needles =
            forge::scan::Needles::new(given.iter().map(|(n, v)| (n.as_str(), v.expose())));
        let bounds = forge::git::Bounds {
            limits: &limits,
            needles: &needles,
        };
        let delivered =
            forge_job::deliver_fix(&self.forges, &plan.job_id, &target.event, prepared, bounds)
                .await;
        match delivered {
            Ok(Some(url)) => {
                draft.proposed(url);
                ending
            }
            Ok(None) => ending,
            Err(instead) => instead,
        }
    }

    fn egress_client(&self) -> egress::control::Client {
        egress::control::Client::new(&self.egress_control)
    }

    /// Asks the proxy for the job's socket in `job_dir`; a proxy that cannot be reached or
    /// refuses is an infrastructure fault: the job is tried again.
    async fn open_egress(&self, draft: &Draft, job_dir: &Path) -> Result<(), Verdict> {
        use egress::control::ClientError;
        let socket = job_dir.join(job_dir::EGRESS_SOCKET);
        let job_id = draft.job_id().to_owned();
        let fault = |why: String| {
            tracing::warn!(event = "egress_open_failed", job_id = %job_id, why = %why);
            let fix =
                "check that the egress proxy runs (`pi-dispatch doctor`); the job is tried again";
            let ending =
                Ending::of(Reason::ContainerNeverStarted).with_detail(Detail::new(why), fix);
            Verdict::from(draft.finish(ending))
        };
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(fault(format!(
                "the job's socket to the egress proxy would be longer than a unix socket's path may be ({MAX_SOCKET_PATH} bytes): move the deployment to a shorter folder"
            )));
        }
        let client = self.egress_client();
        let id = job_id.clone();
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
                tracing::info!(event = "egress_opened", job_id = %job_id);
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
    async fn close_egress(&self, draft: &Draft) -> Vec<EgressDenial> {
        let client = self.egress_client();
        let job_id = draft.job_id().to_owned();
        let id = job_id.clone();
        let closed = tokio::task::spawn_blocking(move || client.close(&id)).await;
        match closed {
            Ok(Ok(denied)) => {
                if !denied.is_empty() {
                    tracing::info!(event = "egress_denied", job_id = %job_id,
                        hosts = denied.len(), refusals = denied.iter().map(|d| d.count).sum::<u64>());
                }
                denied
            }
            Ok(Err(e)) => {
                tracing::warn!(event = "egress_close_failed", job_id = %job_id, detail = %e);
                Vec::new()
            }
            Err(_) => Vec::new(),
        }
    }

    /// Waits until no other job works in the plan's workspace, or until the job is stopped.
    async fn wait_for_folder(
        &self,
        plan: &Admitted,
        draft: &Draft,
        stop: &mut StopSignal,
    ) -> Result<FolderLock, Verdict> {
        let folder = &plan.workspace.path;
        let mut said = false;
        loop {
            if let Some(cause) = *stop.borrow() {
                return Err(stopped_before_start(draft, cause));
            }
            match try_lock_folder(&self.locks_dir, folder) {
                Ok(Some(lock)) => return Ok(lock),
                Ok(None) if !said => {
                    tracing::info!(event = "job_waits_for_folder", job_id = %plan.job_id, folder = %folder);
                    said = true;
                }
                Ok(None) => {}
                Err(e) => {
                    let why = format!("the folder lock cannot be taken ({})", e.kind());
                    let detail = Detail::new(why).path(self.locks_dir.display().to_string());
                    return Err(draft.failed(Reason::JobFolderFailed, detail).into());
                }
            }
            tokio::select! {
                () = tokio::time::sleep(LOCK_POLL) => {}
                cause = stopped(stop) => return Err(stopped_before_start(draft, cause)),
            }
        }
    }

    async fn resolve_secrets(
        &self,
        plan: &Admitted,
        draft: &Draft,
    ) -> Result<Vec<(String, Secret)>, Verdict> {
        let Some(profile) = &plan.secrets_profile else {
            return Ok(Vec::new());
        };
        let wanted: Vec<(String, String)> = plan
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
            tracing::warn!(event = reason.log_event(), job_id = %plan.job_id, reason = %reason, detail = %e);
            draft.failed(reason, Detail::new(e.to_string())).into()
        })
    }

    /// Every value the job is given that the worker resolved, forwarded or minted, by its
    /// variable: the provider's key, the trigger's secrets, what `PI_FORWARD_ENV` forwards, the
    /// forge token. The transcript and the final message never hold one, and a `fix` job's
    /// change holding one is not pushed.
    fn given_values(
        &self,
        plan: &Admitted,
        secrets: &[(String, Secret)],
        prepared: Option<&Prepared>,
    ) -> Vec<(String, Secret)> {
        let key = plan
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
}

/// The record of a job stopped before its sandbox started; nothing at all when the worker is
/// stopping, which hands the job back.
fn stopped_before_start(draft: &Draft, cause: StopCause) -> Verdict {
    match cause {
        StopCause::Shutdown => Verdict::HandBack,
        StopCause::Cancelled => {
            tracing::info!(event = "job_cancelled", job_id = %draft.job_id(), started = false);
            draft.ended(Reason::Cancelled).into()
        }
    }
}
