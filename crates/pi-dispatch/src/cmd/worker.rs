//! `pi-dispatch worker`: runs the queue's jobs, `PI_WORKER_CONCURRENCY` at a time, each in its own
//! sandbox under `PI_JOB_TIME_LIMIT`, and writes their records; cron triggers queue their jobs on
//! schedule while it runs. `--until-empty` returns once nothing is left to run.
//!
//! SIGTERM or SIGINT drains it: it takes no new job, lets the running ones finish for up to
//! `PI_WORKER_DRAIN_LIMIT` seconds, then stops the rest and hands them back to the queue, and exits
//! 0. A second signal stops at once.
//!
//! With egress on (`PI_EGRESS`, the default), an egress proxy answers on its control socket before
//! the worker takes a job: the one already serving `PI_EGRESS_PROXY_DIR`, else `pi-dispatch
//! egress-proxy` started as the worker's child, started again if it ends, and stopped with the
//! worker.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sandbox::backend::Bubblewrap;
use worker::pipeline::Worker;
use worker::service::{self, Control, LoopOptions};

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Jobs run at once [default: PI_WORKER_CONCURRENCY, else 1].
    #[arg(long, value_name = "N")]
    concurrency: Option<u32>,
    /// Seconds a job may run [default: PI_JOB_TIME_LIMIT, else 3600].
    #[arg(long, value_name = "SECONDS")]
    time_limit: Option<u64>,
    /// Return once the queue has nothing left to run (cron triggers are not run).
    #[arg(long)]
    until_empty: bool,
    /// Seconds a job's lease lasts without renewal: a job whose worker dies runs again after this.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    lease: u64,
    /// Milliseconds an idle worker waits before asking the queue again.
    #[arg(long, value_name = "MS", default_value_t = 500, hide = true)]
    poll_ms: u64,
    /// Pass each runner's standard error through (pi's and the MCP servers' own output: for
    /// debugging a deployment only, as it may hold anything a job prints).
    #[arg(long)]
    runner_stderr: bool,
    /// bubblewrap.
    #[arg(long, value_name = "FILE", default_value = sandbox::bwrap::BWRAP, hide = true)]
    bwrap: PathBuf,
}

/// The GitHub App's key, when `PI_GITHUB_APP_KEY_FILE` is set: read and parsed, or why it cannot be
/// used (the reason names no part of the file).
pub fn github_app_key(
    settings: &config::settings::Settings,
) -> Option<Result<forge::AppKey, String>> {
    let file = settings.github_app_key_file.as_ref()?;
    Some(
        std::fs::read_to_string(file)
            .map_err(|e| format!("cannot be read ({})", e.kind()))
            .and_then(|text| forge::AppKey::from_pem(&text).map_err(|e| e.to_string())),
    )
}

/// Whether the GitHub App's key can sign, as the worker reads it (`None`: no key file is set): the
/// admission of `explain`, `doctor` and `run` is told the same as the worker's.
pub fn github_key_usable(settings: &config::settings::Settings) -> Option<bool> {
    github_app_key(settings).map(|key| key.is_ok())
}

/// The forges the worker acts on, from the settings: a GitHub App whose key file can be read, and
/// a GitLab with its token. What cannot be used is said once here; its jobs then fail to mint.
pub fn forges(
    settings: &config::settings::Settings,
    env: &pickup::fs::Environment,
) -> forge::Forges {
    use config::settings as s;
    let github = match (settings.github_app_id, github_app_key(settings)) {
        (Some(app_id), Some(key)) => match key {
            Ok(key) => Some(forge::GithubApp {
                api_url: settings.github_api_url.clone(),
                git_url: settings.github_url.clone(),
                app_id,
                key: Arc::new(key),
            }),
            Err(why) => {
                tracing::warn!(event = "forge_unusable", setting = s::GITHUB_APP_KEY_SETTING, why = %why);
                None
            }
        },
        _ => None,
    };
    let gitlab = match (
        settings.gitlab_url.as_deref(),
        env.get(s::GITLAB_TOKEN_SETTING),
    ) {
        (Some(url), Some(token)) => {
            pickup::admission::gitlab_api_url(url).map(|api_url| forge::GitlabDeployment {
                url: api_url.trim_end_matches("/api/v4").to_owned(),
                api_url,
                token: forge::Secret::new(token),
            })
        }
        _ => None,
    };
    forge::Forges::new(github, gitlab)
}

/// How often the worker prunes what jobs left (`PI_KEEP_*_DAYS`).
const PRUNE_EVERY: Duration = Duration::from_secs(600);

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    ctx.deployment()?;
    // The worker holds the provider's key and every job's secrets: neither it nor anything it
    // starts (each job's sandbox and runner) leaves a core file.
    crate::cmd::job::no_core_files()?;
    let settings = ctx.settings()?;
    let (concurrency, time_limit) = limits(args, &settings)?;
    let state = ctx.dir.join("state");
    let queue = ctx.queue(&settings)?;
    let options = loop_options(args, &settings, &state, concurrency);
    let drain_limit = Duration::from_secs(settings.drain_limit_secs);
    let backend = backend(&args.bwrap, &settings)?;
    let how = How {
        time_limit,
        backend,
        runner_stderr: args.runner_stderr,
    };
    let worker = Arc::new(job_worker(ctx, settings, &state, how)?);
    let records = Arc::new(crate::cmd::runs::records(ctx)?);
    open_state(&state)?;
    let control = Arc::new(Control::default());
    on_signals(control.clone(), drain_limit)?;
    if !args.until_empty {
        start_schedules(ctx, &worker, &queue, &options, &control)?;
    }
    tracing::info!(event = "worker_started", worker = %options.worker_id, concurrency,
        labels = %options.labels.join(","));
    // Before the first job: with egress on, a proxy answers.
    let proxy = if worker.settings.egress {
        Some(start_proxy(ctx, worker.egress_control.clone())?)
    } else {
        None
    };
    let spares = worker.disks.clone();
    let groups = worker.cgroups.clone().zip(
        worker
            .identities
            .as_ref()
            .map(|i| (i.pool.first..=i.pool.last, i.pool.lock_dir.clone())),
    );
    let summary = service::run(worker, queue, records, &options, control.clone());
    // The disks made ahead for the next jobs are unmounted and removed with the worker, and so
    // are the control groups of the ids no job holds now.
    if let Some(spares) = spares {
        spares.close();
    }
    if let Some((hierarchy, (ids, lock_dir))) = groups {
        sandbox::cgroup::remove_idle(&hierarchy, ids, &lock_dir);
    }
    // Every job has ended: the proxy the worker started goes with it.
    if let Some(proxy) = proxy {
        proxy.stop();
    }
    crate::output::print(&stopped(&summary, &control))?;
    Ok(Exit::Success)
}

/// Jobs run at once and each job's time limit, from the flags or the settings, refused when out
/// of bounds.
fn limits(args: &Args, settings: &config::settings::Settings) -> anyhow::Result<(u32, Duration)> {
    let concurrency = args.concurrency.unwrap_or(settings.concurrency);
    if !(1..=config::settings::MAX_CONCURRENCY).contains(&concurrency) {
        anyhow::bail!(
            "--concurrency must be from 1 to {}",
            config::settings::MAX_CONCURRENCY
        );
    }
    let time_limit = Duration::from_secs(args.time_limit.unwrap_or(settings.time_limit_secs));
    if time_limit.is_zero() || args.lease == 0 {
        anyhow::bail!("--time-limit and --lease must be at least one second");
    }
    Ok((concurrency, time_limit))
}

/// How the loop of slots runs: the worker's card, its leases, polls, disk gate and retention.
fn loop_options(
    args: &Args,
    settings: &config::settings::Settings,
    state: &std::path::Path,
    concurrency: u32,
) -> LoopOptions {
    let host = settings.host_name();
    let worker_id = format!("{host}:{}", std::process::id());
    let labels = settings.labels();
    LoopOptions {
        worker_id: worker_id.clone(),
        lease_for: Duration::from_secs(args.lease),
        concurrency,
        until_empty: args.until_empty,
        poll: Duration::from_millis(args.poll_ms.max(10)),
        cancel_poll: Duration::from_millis(500),
        on_failure: settings.on_failure.clone(),
        disk: Some(worker::service::DiskGate {
            folder: state.to_owned(),
            min_free: settings.disk_min_bytes,
        }),
        retention: Some(worker::retention::Retention {
            keep: settings.keep,
            jobs_dir: state.join("jobs"),
        }),
        labels: labels.clone(),
        heartbeat: Some(worker::service::Heartbeat {
            card: queue::WorkerCard {
                id: worker_id,
                host,
                pid: std::process::id(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                labels,
                concurrency,
                started_ms: records::record::now_ms(),
                running: 0,
                draining: false,
            },
            every: Duration::from_secs(settings.heartbeat_secs),
        }),
        live: true,
    }
}

/// How this worker runs its jobs: their time limit, the sandbox, and whether the runner's standard
/// error is passed through.
pub(crate) struct How {
    pub(crate) time_limit: Duration,
    pub(crate) backend: Arc<dyn sandbox::backend::Backend>,
    pub(crate) runner_stderr: bool,
}

/// What each job runs with on this host: its forges, bounds, ids, disk and sandbox backend.
pub(crate) fn job_worker(
    ctx: &Context,
    settings: config::settings::Settings,
    state: &std::path::Path,
    how: How,
) -> anyhow::Result<Worker> {
    let egress_control = settings.egress_proxy_dir.join(egress::control::SOCKET);
    let forges = Arc::new(forges(&settings, &ctx.environment()?));
    let cgroups = job_cgroups(&settings);
    let root = rustix::process::geteuid().is_root();
    let identities = root.then(|| job_identities(&settings, state));
    let disks = if root {
        job_disks(&settings, state)
    } else {
        None
    };
    // A handle of its own on the queue's store, for the servers' pins.
    let pins = Some(ctx.queue(&settings)?);
    Ok(Worker {
        pins,
        approving: None,
        cgroups,
        identities,
        disks,
        forges,
        locks_dir: state.join("locks"),
        backend: how.backend,
        env: ctx.environment()?,
        time_limit: how.time_limit,
        runner_stderr: how.runner_stderr,
        egress_control,
        settings,
    })
}

/// The control groups each bubblewrap job's bounds are kept in, which only root can make here (a
/// container's are the engine's: --pids-limit and --memory); said once when there are none.
fn job_cgroups(settings: &config::settings::Settings) -> Option<sandbox::cgroup::Hierarchy> {
    let bubblewrap = matches!(
        settings.sandbox,
        config::settings::SandboxBackend::Bubblewrap
    );
    let cgroups = if bubblewrap && rustix::process::geteuid().is_root() {
        sandbox::cgroup::detect()
    } else {
        None
    };
    if bubblewrap && cgroups.is_none() {
        tracing::warn!(
            event = "job_bounds_unavailable",
            detail = "no control groups the worker can make: jobs run without PI_JOB_PIDS, PI_JOB_MEMORY_MB and PI_JOB_CPU_SECS (docs/sandbox.md)"
        );
    }
    cgroups
}

/// A root worker runs each job as an id of its own pool, the job's workspace an idmapped view of
/// the repository; what a worker killed outright left attached goes first (never what a live
/// worker of the deployment has mounted for its jobs).
fn job_identities(
    settings: &config::settings::Settings,
    state: &std::path::Path,
) -> sandbox::identity::Identities {
    let identities = sandbox::identity::Identities {
        pool: sandbox::identity::Pool::new(
            settings.job_uids.0,
            settings.job_uids.1,
            sandbox::identity::LOCK_DIR,
        ),
        mappings: sandbox::identity::Mappings::default(),
    };
    sandbox::identity::sweep_jobs(&state.join("jobs"));
    identities
}

/// What each job writes goes to a disk of its own, where the host can make one: the first id's
/// is made now, and each id keeps its disk, emptied after each of its jobs.
fn job_disks(
    settings: &config::settings::Settings,
    state: &std::path::Path,
) -> Option<Arc<sandbox::disk::Spares>> {
    match sandbox::disk::available() {
        Ok(()) => {
            let spares = sandbox::disk::Spares::new(&state.join("disks"), settings.job_disk_bytes);
            if let Err(e) = spares.prepare(settings.job_uids.0) {
                tracing::warn!(event = "job_disk_failed", detail = %e);
            }
            Some(Arc::new(spares))
        }
        Err(why) => {
            tracing::warn!(event = "job_disk_unavailable",
                detail = %format!("{why}: jobs write to their workspace without PI_JOB_DISK_MB (docs/sandbox.md)"));
            None
        }
    }
}

/// The sandbox the settings choose: bubblewrap with this program's `job-limits`, or Podman.
pub(crate) fn backend(
    bwrap: &std::path::Path,
    settings: &config::settings::Settings,
) -> anyhow::Result<Arc<dyn sandbox::backend::Backend>> {
    Ok(match &settings.sandbox {
        config::settings::SandboxBackend::Bubblewrap => Arc::new(Bubblewrap {
            bwrap: bwrap.to_owned(),
            limits: vec![
                std::env::current_exe()?.into_os_string(),
                "job-limits".into(),
            ],
        }),
        config::settings::SandboxBackend::Podman { base, runtime, .. } => {
            Arc::new(sandbox::podman::Podman {
                program: settings.sandbox.engine_or_podman().into(),
                runtime: runtime.clone(),
                limits: sandbox::podman::Limits::within_own(),
                base_image: base.clone(),
                launcher: sandbox::podman::LAUNCHER.iter().map(Into::into).collect(),
            })
        }
    })
}

/// A job's sandbox runs as another user, which must reach its job folder (and nothing else of the
/// state): state/ and state/jobs/ are traversable but not listable.
pub(crate) fn open_state(state: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(state.join("jobs"))?;
    for dir in [state, &state.join("jobs")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    }
    Ok(())
}

/// Cron triggers, and retention on handles of its own (a pass never waits on a job's), each on a
/// thread of its own until the worker stops.
fn start_schedules(
    ctx: &Context,
    worker: &Worker,
    queue: &Arc<dyn queue::Queue>,
    options: &LoopOptions,
    control: &Arc<Control>,
) -> anyhow::Result<()> {
    let (settings, queue, cron) = (worker.settings.clone(), queue.clone(), control.clone());
    std::thread::spawn(move || {
        service::run_cron(&settings, &*queue, Duration::from_secs(1), &cron)
    });
    let (records, queue, control) = (
        crate::cmd::runs::records(ctx)?,
        ctx.queue(&worker.settings)?,
        control.clone(),
    );
    if let Some(retention) = options.retention.clone() {
        std::thread::spawn(move || {
            service::run_retention(&retention, &records, &*queue, PRUNE_EVERY, &control)
        });
    }
    Ok(())
}

/// What the worker did, logged and said as it stops (drained by a signal, or the queue empty).
fn stopped(summary: &service::Summary, control: &Control) -> String {
    let count = |n: &std::sync::atomic::AtomicUsize| n.load(std::sync::atomic::Ordering::Relaxed);
    let (written, retries, back) = (
        count(&summary.records),
        count(&summary.retries),
        count(&summary.handed_back),
    );
    tracing::info!(
        event = "worker_stopped",
        records = written,
        retries,
        handed_back = back
    );
    if control.is_draining() {
        format!(
            "Stopped: {written} records written, {retries} retries, {back} jobs handed back to the queue.\n"
        )
    } else {
        format!("The queue is empty: {written} records written, {retries} retries.\n")
    }
}

/// Makes sure an egress proxy answers on `control` (see [`worker::egress`]): the worker's own
/// executable, run as `egress-proxy` on the same deployment folder and log format.
pub(crate) fn start_proxy(
    ctx: &Context,
    control: PathBuf,
) -> anyhow::Result<worker::egress::Supervisor> {
    let program = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot find the worker's own program ({})", e.kind()))?;
    let command = worker::egress::ProxyCommand {
        control,
        program,
        args: [
            "--dir".into(),
            ctx.dir.clone().into_os_string(),
            "--log-format".into(),
            ctx.log_format.into(),
            "egress-proxy".into(),
            "--worker-pid".into(),
            std::process::id().to_string().into(),
        ]
        .into(),
    };
    let (supervisor, source) = worker::egress::Supervisor::start(command)
        .map_err(|e| anyhow::anyhow!("egress is on and {e}: no job can run without it"))?;
    tracing::info!(
        event = "egress_proxy_ready",
        shared = matches!(source, worker::egress::Source::Shared)
    );
    Ok(supervisor)
}

/// The first SIGTERM or SIGINT drains the worker (and, after `drain_limit`, stops it); a second
/// one stops it at once.
fn on_signals(control: Arc<Control>, drain_limit: Duration) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .map_err(|e| anyhow::anyhow!("cannot watch for SIGTERM and SIGINT ({})", e.kind()))?;
    std::thread::spawn(move || {
        for signal in signals.forever() {
            if control.is_draining() {
                tracing::warn!(event = "worker_stopping", signal, why = "a second signal");
                control.stop();
                continue;
            }
            tracing::info!(
                event = "worker_draining",
                signal,
                limit_secs = drain_limit.as_secs()
            );
            control.drain();
            let control = control.clone();
            std::thread::spawn(move || {
                std::thread::sleep(drain_limit);
                if !control.is_stopping() {
                    tracing::warn!(event = "worker_stopping", why = "the drain limit passed");
                    control.stop();
                }
            });
        }
    });
    Ok(())
}
