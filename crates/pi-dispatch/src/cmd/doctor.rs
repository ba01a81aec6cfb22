//! `pi-dispatch doctor [--fix] [--json]`: checks the deployment, one line a check.

use std::fmt::Write as _;
use std::io::{BufRead, IsTerminal, Write};

use serde::Serialize;
use setup::doctor::{self, Check, Level, NoRouteProof, ProxyFound, RouteProof};

use crate::context::{Context, SettingsError};
use crate::exit::Exit;

mod pins;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Offer the fixes doctor can make (it asks first; without a terminal nothing is changed).
    #[arg(long)]
    fix: bool,
    /// Print every check as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    ok: bool,
    checks: &'a [Check],
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    let checks = checks(ctx, args.fix)?;
    let failed = checks.iter().any(|c| c.level == Level::Fail);
    let text = if args.json {
        serde_json::to_string_pretty(&Report {
            ok: !failed,
            checks: &checks,
        })? + "\n"
    } else {
        human(ctx, &checks)
    };
    crate::output::print(&text)?;
    Ok(if failed {
        Exit::CheckFailed
    } else {
        Exit::Success
    })
}

/// Every check of the deployment (the panel's health page shows the same); with `fix`, the
/// fixes doctor can make are offered first.
pub fn checks(ctx: &Context, fix: bool) -> anyhow::Result<Vec<Check>> {
    let settings = match ctx.settings() {
        Ok(settings) => settings,
        Err(e) => {
            let errors: Vec<String> = match e {
                SettingsError::Dotenv(why) => vec![why],
                SettingsError::Values(v) => v.iter().map(ToString::to_string).collect(),
            };
            return Ok(doctor::settings_failed(&errors, &ctx.dir));
        }
    };
    let mut inputs = doctor::gather(settings.clone());
    let notes = if fix && inputs.mcp_auth_json {
        fix_mcp_auth(&settings, &mut inputs)?
    } else {
        Vec::new()
    };
    let names = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .chain(ctx.dotenv()?.keys().cloned());
    inputs.unknown_settings = config::settings::unknown_names(names);
    let bubblewrap = settings.sandbox == config::settings::SandboxBackend::Bubblewrap;
    if bubblewrap {
        inputs.isolation = isolation(&settings);
    }
    if bubblewrap && inputs.bwrap && inputs.image_runner {
        inputs.sandbox = Some(sandbox_probe(&settings));
    }
    let mut checks = if settings.egress {
        doctor::checks(&inputs, &ProxyProbe::new(&settings))
    } else {
        doctor::checks(&inputs, &NoRouteProof)
    };
    if doctor::is_deployment(&inputs) {
        let env = ctx.environment()?;
        checks.extend(queue_checks(&settings, &env));
        checks.extend(pins::checks(&settings, &env, &inputs.mcp));
        checks.extend(forge_checks(&settings, &env));
        checks.extend(admission_checks(&settings, &env));
        checks.push(disk_check(&settings));
    }
    checks.extend(
        notes
            .into_iter()
            .enumerate()
            .map(|(i, note)| Check::ok(format!("fix:{i}"), note)),
    );
    Ok(checks)
}

/// `--fix` for pi's MCP credentials file: deleted once the operator says yes on a terminal (then
/// the inputs are gathered again), else kept. What was done, as notes.
fn fix_mcp_auth(
    settings: &config::settings::Settings,
    inputs: &mut doctor::Inputs,
) -> anyhow::Result<Vec<String>> {
    let path = doctor::mcp_auth_path(settings);
    let note = if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_file()) {
        format!(
            "--fix: kept {}: it is not a plain file, so doctor does not delete it; remove it by hand",
            path.display()
        )
    } else if !std::io::stdin().is_terminal() {
        format!(
            "--fix: kept {}: not a terminal, so nothing was asked and nothing deleted",
            path.display()
        )
    } else if ask(&format!("Delete {}? [y/N] ", path.display()))? {
        std::fs::remove_file(&path)
            .map_err(|e| anyhow::anyhow!("cannot delete {} ({})", path.display(), e.kind()))?;
        *inputs = doctor::gather(settings.clone());
        format!("--fix: deleted {}", path.display())
    } else {
        format!("--fix: kept {} (you said no)", path.display())
    };
    Ok(vec![note])
}

/// How jobs are kept apart on this host: root, job ids no one else claims, control groups, a disk
/// of a job's own.
fn isolation(settings: &config::settings::Settings) -> doctor::Isolation {
    let root = rustix::process::geteuid().is_root();
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    doctor::Isolation {
        root,
        ids_claimed: doctor::ids_claimed(
            settings.job_uids,
            [
                &read("/etc/passwd"),
                &read("/etc/group"),
                &read("/etc/subuid"),
                &read("/etc/subgid"),
            ],
        ),
        cgroups: root && sandbox::cgroup::detect().is_some(),
        no_disk: sandbox::disk::available().err(),
    }
}

/// The room left on the file system of the deployment's state (its records, transcripts, job
/// folders and the queue): a warning below `PI_DISK_WARN_MB`, a failure below `PI_DISK_MIN_MB`,
/// where the worker starts no job.
fn disk_check(settings: &config::settings::Settings) -> Check {
    use config::files::Room;
    use config::settings as s;
    let state = settings.dir.join("state");
    let folder = if state.is_dir() {
        &state
    } else {
        &settings.dir
    };
    let free = match config::files::free_bytes(folder) {
        Ok(free) => free,
        Err(e) => {
            return Check::warn(
                "disk.state",
                format!(
                    "the room left on {}'s disk cannot be read ({})",
                    folder.display(),
                    e.kind()
                ),
                "check that the worker's user can reach the deployment's folder",
            );
        }
    };
    let mib = |bytes: u64| bytes >> 20;
    let label = |how: &str| {
        format!(
            "disk: {} MiB free on {}'s file system{how}",
            mib(free),
            folder.display()
        )
    };
    match Room::of(free, settings.disk_warn_bytes, settings.disk_min_bytes) {
        Room::Enough => Check::ok("disk.state", label("")),
        Room::Low => Check::warn(
            "disk.state",
            label(&format!(
                ", below {} ({} MiB)",
                s::DISK_WARN_SETTING,
                mib(settings.disk_warn_bytes)
            )),
            "free space there soon: below PI_DISK_MIN_MB the worker starts no job",
        ),
        Room::NearlyFull => Check::fail(
            "disk.state",
            label(&format!(
                ", below {} ({} MiB): the worker starts no job",
                s::DISK_MIN_SETTING,
                mib(settings.disk_min_bytes)
            )),
            protocol::reason::Reason::DiskNearlyFull.fix(),
        ),
    }
}

/// The queue, when it is a Redis: that it answers (within a few seconds), its version, and
/// whether it keeps what it acknowledged across a restart (the append-only file).
fn queue_checks(
    settings: &config::settings::Settings,
    env: &pickup::fs::Environment,
) -> Vec<Check> {
    use config::settings as s;
    let config::settings::QueueBackend::Redis { url } = &settings.queue else {
        return Vec::new();
    };
    let target = queue::RedisTarget {
        url: url.clone(),
        password: env.get(s::QUEUE_PASSWORD_SETTING),
    };
    let opened = queue::RedisQueue::open_with(
        &target,
        queue::Config::default(),
        std::time::Duration::from_secs(3),
    )
    .and_then(|q| q.info());
    let info = match opened {
        Ok(info) => info,
        Err(e) => {
            return vec![Check::fail(
                "queue.redis",
                format!("the queue's Redis ({url}) cannot be used: {e}"),
                format!(
                    "start it, or correct {} (and {} if it has a password); every command that queues or runs jobs needs it",
                    s::QUEUE_SETTING,
                    s::QUEUE_PASSWORD_SETTING
                ),
            )];
        }
    };
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let version = field("redis_version").unwrap_or("unknown");
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    let mut out = vec![if major >= 6 {
        Check::ok(
            "queue.redis",
            format!("queue: Redis {version} at {url} answers"),
        )
    } else {
        Check::fail(
            "queue.redis",
            format!("queue: Redis {version} at {url} is older than 6"),
            "use Redis 6 or later (or Valkey)".to_owned(),
        )
    }];
    out.push(if field("aof_enabled") == Some("1") {
        Check::ok("queue.redis-aof", "queue: Redis keeps an append-only file (jobs survive its restart)".to_owned())
    } else {
        Check::warn("queue.redis-aof", 
            "queue: Redis has no append-only file: a restart of Redis can lose queued jobs, or run a finished one again".to_owned(),
            "set appendonly yes in redis.conf (appendfsync always keeps every acknowledged change; everysec may lose the last second)".to_owned(),
        )
    });
    out
}

/// What the worker acts on the forges with: the GitHub App's key (read and parsed as the worker
/// reads it, and kept from other users) and GitLab's URL and token. Nothing when neither forge is
/// set up.
fn forge_checks(
    settings: &config::settings::Settings,
    env: &pickup::fs::Environment,
) -> Vec<Check> {
    let mut out = github_checks(settings);
    out.extend(gitlab_check(settings, env));
    out
}

/// The GitHub App: its id and key, read and parsed as the worker reads it, and kept from others.
fn github_checks(settings: &config::settings::Settings) -> Vec<Check> {
    use config::settings as s;
    let mut out = Vec::new();
    match (settings.github_app_id, &settings.github_app_key_file) {
        (None, None) => {}
        (Some(id), Some(file)) => match crate::cmd::worker::github_app_key(settings) {
            Some(Ok(_)) => {
                out.push(Check::ok("forge.github", format!(
                    "GitHub App {id}: its key ({}) reads and can sign",
                    file.display()
                )));
                use std::os::unix::fs::PermissionsExt as _;
                if std::fs::metadata(file).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
                    out.push(Check::warn("forge.github-key-mode", 
                        format!(
                            "the GitHub App's key ({}) can be read by others than its owner",
                            file.display()
                        ),
                        format!("chmod 600 {}", file.display()),
                    ));
                }
            }
            Some(Err(why)) => out.push(Check::fail("forge.github", 
                format!(
                    "the GitHub App's key ({}) {why}: github jobs are refused (forge-unconfigured)",
                    file.display()
                ),
                format!(
                    "set {} to the private key GitHub gave for the App (a PEM file), mode 0600, readable by the worker's user",
                    s::GITHUB_APP_KEY_SETTING
                ),
            )),
            None => {}
        },
        _ => out.push(Check::fail("forge.github", 
            "a GitHub App is half set up: github jobs are refused (forge-unconfigured)".to_owned(),
            format!(
                "set both {} and {}",
                s::GITHUB_APP_ID_SETTING,
                s::GITHUB_APP_KEY_SETTING
            ),
        )),
    }
    out
}

/// GitLab: its URL and the bot's token.
fn gitlab_check(
    settings: &config::settings::Settings,
    env: &pickup::fs::Environment,
) -> Option<Check> {
    use config::settings as s;
    match (
        settings.gitlab_url.as_deref(),
        env.get(s::GITLAB_TOKEN_SETTING).is_some(),
    ) {
        (None, false) => None,
        (Some(url), true) => Some(match pickup::admission::gitlab_api_url(url) {
            Some(_) => Check::ok("forge.gitlab", format!(
                "GitLab: {} and {} are set",
                s::GITLAB_URL_SETTING,
                s::GITLAB_TOKEN_SETTING
            )),
            None => Check::fail("forge.gitlab", 
                format!(
                    "{} is not a plain http(s) URL: gitlab jobs are refused (forge-unconfigured)",
                    s::GITLAB_URL_SETTING
                ),
                "write GitLab's address as a browser shows it, such as https://gitlab.example.com, with no user, password, query or fragment".to_owned(),
            ),
        }),
        _ => Some(Check::fail("forge.gitlab", 
            "GitLab is half set up: gitlab jobs are refused (forge-unconfigured)".to_owned(),
            format!(
                "set both {} and {} (a bot's token with the Developer role, in the worker's environment file)",
                s::GITLAB_URL_SETTING,
                s::GITLAB_TOKEN_SETTING
            ),
        )),
    }
}

/// What the worker would decide: the deployment's default model, then the job each trigger would
/// queue, each asked of the admission the worker asks.
fn admission_checks(
    settings: &config::settings::Settings,
    env: &pickup::fs::Environment,
) -> Vec<Check> {
    let deployment = pickup::fs::Deployment::new(settings, env)
        .with_github_key(crate::cmd::worker::github_key_usable(settings));
    let mut out = vec![default_model_check(&deployment)];
    let all = match config::triggers::TriggersFile::read(&settings.triggers_file) {
        Ok(all) => all,
        Err(e) => {
            out.push(Check::fail(
                "admission.triggers-file",
                format!("{e}: no trigger can queue a job"),
                "`pi-dispatch triggers check` lists every error",
            ));
            return out;
        }
    };
    for trigger in &all.triggers.triggers {
        out.push(trigger_check(&deployment, trigger));
    }
    out
}

/// A decision of the admission as a check: admitted is ok, refused fails (a forge trigger this
/// version refuses whatever else holds is said, not failed), undecided warns.
fn decision_check(id: String, label: String, decision: &pickup::admission::Decision) -> Check {
    use pickup::admission::Decision;
    match decision {
        Decision::Refuse(r) => {
            let label = format!("{label}: refused, {}: {}", r.reason, r.detail.why);
            let mut check = if r.reason == protocol::reason::Reason::JobKindUnsupported {
                Check::warn(id, label, r.fix.clone())
            } else {
                Check::fail(id, label, r.fix.clone())
            };
            check.reason = Some(r.reason.as_str().to_owned());
            check
        }
        Decision::Retry { detail } => Check::warn(
            id,
            format!("{label}: cannot be decided now ({detail})"),
            "check that the deployment's files can be read; the worker tries again",
        ),
        Decision::Admit(_) => Check::ok(id, label),
    }
}

/// The deployment's default model, as the admission reads it.
fn default_model_check(deployment: &pickup::fs::Deployment) -> Check {
    use pickup::admission::Decision;
    match deployment.default_model() {
        Ok(m) => Check::ok(
            "admission.default-model",
            format!(
                "default model {}/{}: {}{}",
                m.provider,
                m.model,
                if m.source == "builtin" {
                    "in pi's catalog"
                } else {
                    "in the overlay's models.json"
                },
                match &m.key_variable {
                    Some(v) => format!(", its key in {v}"),
                    None => ", keyless".to_owned(),
                }
            ),
        ),
        // No default: a job must name its own model (the worker refuses one that does not).
        Err(Decision::Refuse(r)) if r.reason == protocol::reason::Reason::ModelUnset => {
            let mut check = Check::warn(
                "admission.default-model",
                "no default model (PI_PROVIDER, PI_MODEL): a job that names none is refused (model-unset)",
                r.fix.clone(),
            );
            check.reason = Some(r.reason.as_str().to_owned());
            check
        }
        Err(d) => decision_check(
            "admission.default-model".to_owned(),
            "default model (PI_PROVIDER, PI_MODEL)".to_owned(),
            &d,
        ),
    }
}

/// The job a trigger would queue, asked of the admission.
fn trigger_check(
    deployment: &pickup::fs::Deployment,
    trigger: &config::triggers::Trigger,
) -> Check {
    let job = crate::cmd::explain::trigger_job(trigger);
    let named = format!(
        "trigger {} ({} -> {})",
        trigger.index,
        trigger.on.type_name(),
        trigger.run.kind.as_str()
    );
    let decision = deployment.decide(&job);
    let label = match &decision {
        pickup::admission::Decision::Admit(_) => format!("{named}: its job would be admitted"),
        _ => named,
    };
    decision_check(
        format!("admission.trigger:{}", trigger.index),
        label,
        &decision,
    )
}

/// Asks on the terminal (stderr, so `--json` output stays clean); only "y" or "yes" is a yes.
fn ask(question: &str) -> anyhow::Result<bool> {
    let mut err = std::io::stderr().lock();
    write!(err, "{question}")?;
    err.flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

fn human(ctx: &Context, checks: &[Check]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "pi-dispatch doctor: {}", ctx.dir.display());
    for c in checks {
        let mark = match c.level {
            Level::Ok => "✓",
            Level::Warn => "⚠",
            Level::Fail => "✗",
        };
        let _ = writeln!(out, "{mark} {}", c.label);
        if let Some(fix) = &c.fix {
            for (i, line) in fix.lines().enumerate() {
                let lead = if i == 0 { "fix:" } else { "    " };
                let _ = writeln!(out, "    {lead} {line}");
            }
        }
    }
    let count = |l: Level| checks.iter().filter(|c| c.level == l).count();
    let _ = writeln!(
        out,
        "{} ok, {} warnings, {} failed",
        count(Level::Ok),
        count(Level::Warn),
        count(Level::Fail)
    );
    out
}

/// Starts a sandbox as the worker starts a job's: bubblewrap nested, with the job's network, the
/// default image's runner confining one process in it the way it confines pi and each server.
/// Nothing of the deployment's environment goes in.
fn sandbox_probe(settings: &config::settings::Settings) -> Result<(), String> {
    let folder = tempfile::Builder::new()
        .prefix("pi-dispatch-doctor")
        .tempdir()
        .map_err(|e| format!("no temporary folder ({})", e.kind()))?;
    let job_dir = folder.path().join("job");
    let workspace = folder.path().join("workspace");
    for dir in [&job_dir, &workspace] {
        std::fs::create_dir(dir).map_err(|e| format!("no temporary folder ({})", e.kind()))?;
    }
    let image = settings
        .job_image
        .as_deref()
        .unwrap_or(config::settings::DEFAULT_JOB_IMAGE);
    let overlay = if settings.overlay_dir.is_dir() {
        settings.overlay_dir.clone()
    } else {
        folder.path().to_owned()
    };
    let root = rustix::process::geteuid().is_root();
    let mut held = ProbeHeld::default();
    let (workspace, host_user) = if root {
        held.take_as_root(settings, folder.path(), workspace)?
    } else {
        (workspace, None)
    };
    held.outside = probe_network(settings, root, held.cgroup.as_ref())?;
    // As the worker gives a root worker's job its read-only folders: overlays of their own.
    let image_dir = settings.dir.join("images").join(image);
    let [job_dir, overlay_dir, image_dir] = if root {
        let (masked, places) = probe_masked(folder.path(), [job_dir, overlay, image_dir])?;
        held.masked = Some(masked);
        places
    } else {
        [job_dir, overlay, image_dir]
    };
    let spec = sandbox::backend::JobSpec {
        job_dir,
        overlay_dir,
        image_dir,
        image_name: image.to_owned(),
        workspace,
        host_user,
        network: match &held.outside {
            Some(o) => sandbox::backend::Network::Outside {
                netns: std::os::fd::AsRawFd::as_raw_fd(&o.netns()),
            },
            None => sandbox::backend::Network::None,
        },
        program: std::path::Path::new(sandbox::bwrap::IMAGE)
            .join(protocol::image::RUNNER)
            .into_os_string(),
        args: [
            "job-confine",
            "--private-tmp",
            "--",
            "/bin/sh",
            "-c",
            "exit 0",
        ]
        .iter()
        .map(Into::into)
        .collect(),
        nested: true,
        bounds: held.cgroup.as_ref().map(|c| sandbox::backend::Bounds {
            join: c.procs_files(),
            cpu_secs: settings.job_cpu_secs,
            tmp_bytes: settings.job_memory_bytes,
        }),
    };
    run_probe(&spec)
}

/// What a probe's sandbox holds on the host while it runs, let go in this order once it ended:
/// its network, its folders' overlays, its disk, its workspace's view, its control groups, its id.
#[derive(Default)]
struct ProbeHeld {
    outside: Option<sandbox::outside::Outside>,
    masked: Option<sandbox::masked::Masked>,
    disk: Option<sandbox::disk::JobDisk>,
    view: Option<sandbox::identity::IdmappedFolder>,
    cgroup: Option<sandbox::cgroup::JobCgroup>,
    identity: Option<sandbox::identity::Identity>,
}

impl ProbeHeld {
    /// As the worker would under root: an id of the pool with an idmapped view of the workspace
    /// (on a disk of its own where the host can make one), and the job's control groups joined
    /// through job-limits. The workspace the job sees, and the id it runs as.
    fn take_as_root(
        &mut self,
        settings: &config::settings::Settings,
        folder: &std::path::Path,
        workspace: std::path::PathBuf,
    ) -> Result<(std::path::PathBuf, Option<(u32, u32)>), String> {
        let pool = sandbox::identity::Pool::new(
            settings.job_uids.0,
            settings.job_uids.1,
            sandbox::identity::LOCK_DIR,
        );
        let (taken, _) = pool
            .take()
            .map_err(|e| format!("the pool of job ids cannot be used ({})", e.kind()))?;
        let taken = taken.ok_or("every id of PI_JOB_UIDS is taken")?;
        let id = (taken.uid, taken.gid);
        let userns = sandbox::identity::mapping((0, 0), id)
            .map_err(|e| format!("no user namespace for the job's view ({})", e.kind()))?;
        let mounted =
            sandbox::identity::IdmappedFolder::attach(&workspace, &userns, &folder.join("view"))
                .map_err(|e| {
                    format!(
                        "the job's idmapped view of its workspace cannot be made ({}): idmapped mounts need Linux 5.12 and a file system that has them",
                        e.kind()
                    )
                })?;
        let mut workspace = mounted.path().to_owned();
        self.identity = Some(taken);
        self.view = Some(mounted);
        if sandbox::disk::available().is_ok() {
            let made =
                sandbox::disk::JobDisk::make(folder, &workspace, settings.job_disk_bytes, id)
                    .map_err(|e| format!("the job's disk cannot be made ({})", e.kind()))?;
            workspace = made.path().to_owned();
            self.disk = Some(made);
        }
        if let Some(hierarchy) = sandbox::cgroup::detect() {
            let limits = sandbox::cgroup::Limits {
                pids: settings.job_pids,
                memory_bytes: settings.job_memory_bytes,
                cpu_secs: settings.job_cpu_secs,
            };
            self.cgroup = Some(
                sandbox::cgroup::JobCgroup::take(&hierarchy, id.0, &limits).map_err(|e| {
                    format!("the job's control groups cannot be made ({})", e.kind())
                })?,
            );
        }
        Ok((workspace, Some(id)))
    }
}

/// With egress off, the job's own network, as the worker makes it (root only: the worker refuses
/// such a job otherwise, and so does this check).
fn probe_network(
    settings: &config::settings::Settings,
    root: bool,
    cgroup: Option<&sandbox::cgroup::JobCgroup>,
) -> Result<Option<sandbox::outside::Outside>, String> {
    match (settings.egress, root) {
        (true, _) => Ok(None),
        (false, false) => Err(
            "with egress off a job's own network is made by a worker running as root".to_owned(),
        ),
        (false, true) => Ok(Some(
            sandbox::outside::Outside::start(
                std::path::Path::new(sandbox::outside::SLIRP4NETNS),
                &cgroup.map(|c| c.procs_files()).unwrap_or_default(),
            )
            .map_err(|e| e.to_string())?,
        )),
    }
}

/// The job's folder, the overlay and the image as overlays of their own, and where each is now.
fn probe_masked(
    folder: &std::path::Path,
    [job_dir, overlay, image_dir]: [std::path::PathBuf; 3],
) -> Result<(sandbox::masked::Masked, [std::path::PathBuf; 3]), String> {
    let (masked, places) = sandbox::masked::Masked::over(folder, &[&job_dir, &overlay, &image_dir])
        .map_err(|e| format!("the job's folders cannot be mounted for it ({})", e.kind()))?;
    let places: [std::path::PathBuf; 3] = places
        .try_into()
        .map_err(|_| "the job's folders cannot be mounted for it".to_owned())?;
    Ok((masked, places))
}

/// Runs the probe's sandbox with bubblewrap and this program's job-limits, for up to 10
/// seconds: it passes when it exits well, else what it last said on its standard error.
fn run_probe(spec: &sandbox::backend::JobSpec) -> Result<(), String> {
    use sandbox::backend::Backend as _;
    let backend = sandbox::backend::Bubblewrap {
        bwrap: setup::doctor::BWRAP.into(),
        limits: vec![
            std::env::current_exe()
                .map_err(|e| format!("this program cannot be found ({})", e.kind()))?
                .into_os_string(),
            "job-limits".into(),
        ],
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("no runtime ({})", e.kind()))?;
    runtime.block_on(async {
        let env = sandbox::env::JobEnv::default();
        let mut job = backend.start(spec, &env).await.map_err(|e| e.to_string())?;
        let stderr = job.stderr();
        let ending = job
            .wait_with_limit(std::time::Duration::from_secs(10))
            .await
            .map_err(|e| format!("waiting for it failed ({})", e.kind()))?;
        let said = last_said(stderr).await;
        match ending {
            sandbox::bwrap::Ending::Exited(status) if status.success() => Ok(()),
            sandbox::bwrap::Ending::Exited(status) => Err(if said.is_empty() {
                format!("it ended with {status}")
            } else {
                said.trim().to_owned()
            }),
            sandbox::bwrap::Ending::KilledAtLimit => {
                Err("it did not end within 10 seconds".to_owned())
            }
        }
    })
}

/// The last line that is not blank in the first 4 KiB of a standard error.
async fn last_said<R: tokio::io::AsyncRead + Unpin>(stderr: Option<R>) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut said = String::new();
    if let Some(mut stderr) = stderr {
        let _ = (&mut stderr).take(4096).read_to_string(&mut said).await;
    }
    said.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_owned()
}

/// The egress proxy as a job meets it: the running one (the worker's, or a standalone one), else
/// one doctor starts on the same files for as long as it runs; a job socket of doctor's own on it.
struct ProxyProbe {
    found: ProxyFound,
    client: Option<egress::control::Client>,
    job: String,
    socket: std::path::PathBuf,
    _folder: Option<tempfile::TempDir>,
    own: Option<(tokio::runtime::Runtime, egress::service::Started)>,
}

impl ProxyProbe {
    fn new(settings: &config::settings::Settings) -> ProxyProbe {
        let job = format!("doctor-{}", std::process::id());
        let mut probe = ProxyProbe {
            found: ProxyFound::Unavailable(String::new()),
            client: None,
            socket: std::path::PathBuf::new(),
            job,
            _folder: None,
            own: None,
        };
        let folder = match tempfile::Builder::new()
            .prefix("pi-dispatch-doctor")
            .tempdir()
        {
            Ok(f) => f,
            Err(e) => {
                probe.found = ProxyFound::Unavailable(format!("no temporary folder: {}", e.kind()));
                return probe;
            }
        };
        let running =
            egress::control::Client::new(settings.egress_proxy_dir.join(egress::control::SOCKET));
        let client = match running.ping() {
            Ok(reply) => {
                probe.found = ProxyFound::Running {
                    pid: reply.pid.unwrap_or_default(),
                    jobs: reply.jobs.unwrap_or_default(),
                };
                running
            }
            Err(_) => match Self::start_own(settings, folder.path()) {
                Ok((runtime, started)) => {
                    let client = egress::control::Client::new(started.socket.clone());
                    probe.own = Some((runtime, started));
                    probe.found = ProxyFound::StartedForDoctor;
                    client
                }
                Err(why) => {
                    probe.found = ProxyFound::Unavailable(why);
                    return probe;
                }
            },
        };
        let socket = folder.path().join("probe.sock");
        if let Err(e) = client.open(&probe.job, &socket) {
            probe.found = ProxyFound::Unavailable(e.to_string());
            return probe;
        }
        probe.socket = socket;
        probe.client = Some(client);
        probe._folder = Some(folder);
        probe
    }

    fn start_own(
        settings: &config::settings::Settings,
        folder: &std::path::Path,
    ) -> Result<(tokio::runtime::Runtime, egress::service::Started), String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| e.kind().to_string())?;
        let started = {
            let _in = runtime.enter();
            egress::service::start(egress::service::Options {
                dir: folder.join("egress"),
                files: egress::files::RuleFiles {
                    allowlist: settings.egress_allowlist.clone(),
                    endpoints: settings.model_endpoints.clone(),
                },
                resolver: settings.egress_nameserver.map_or(
                    egress::dns::Resolver::System,
                    egress::dns::Resolver::Nameserver,
                ),
                limits: egress::Limits::default(),
            })
            .map_err(|e| e.to_string())?
        };
        Ok((runtime, started))
    }

    /// Asks the proxy for a tunnel to `authority`; its status code and the open stream.
    fn connect(
        &self,
        authority: &str,
    ) -> Result<(u16, String, std::os::unix::net::UnixStream), String> {
        use std::io::Read as _;
        let mut stream = std::os::unix::net::UnixStream::connect(&self.socket)
            .map_err(|e| format!("the job socket does not answer ({})", e.kind()))?;
        let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(15)));
        stream
            .write_all(
                format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes(),
            )
            .map_err(|e| format!("the job socket does not answer ({})", e.kind()))?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
            match stream.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => return Err("the proxy did not answer".to_owned()),
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| "the proxy's answer is not HTTP".to_owned())?;
        let code = text
            .lines()
            .find_map(|l| l.strip_prefix("X-Pi-Dispatch-Egress: "))
            .unwrap_or("")
            .to_owned();
        Ok((status, code, stream))
    }
}

impl RouteProof for ProxyProbe {
    fn proxy(&self) -> ProxyFound {
        self.found.clone()
    }

    fn prove(&self, host: &str, port: u16) -> Result<(), String> {
        use std::io::Read as _;
        if self.client.is_none() {
            return Err("not proven: no egress proxy".to_owned());
        }
        let (status, code, mut stream) = self.connect(&format!("{host}:{port}"))?;
        match status {
            200 => {
                // Anything at all is an answer: an https server closing a plain request too.
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let _ = stream.write_all(b"HEAD / HTTP/1.0\r\n\r\n");
                let mut byte = [0u8; 1];
                match stream.read(&mut byte) {
                    // A byte, a close or a reset: something is there.
                    Ok(0 | 1) => Ok(()),
                    Err(e)
                        if !matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        Ok(())
                    }
                    _ => {
                        Err("the proxy connected, but nothing answered there within 5 s".to_owned())
                    }
                }
            }
            403 if code == "unresolved" => {
                Err("its name does not resolve (looked up as the egress proxy does)".to_owned())
            }
            403 => Err(format!("the egress proxy refuses it ({code})")),
            _ => Err(format!(
                "nothing answers there through the egress proxy ({code})"
            )),
        }
    }

    fn canary(&self) -> Result<(), String> {
        if self.client.is_none() {
            return Err("no egress proxy".to_owned());
        }
        match self.connect("egress-canary.invalid:443") {
            Ok((403, code, _)) if code == "not-allowed" => Ok(()),
            Ok((status, code, _)) => Err(format!("it answered {status} {code}")),
            Err(why) => Err(why),
        }
    }
}

impl Drop for ProxyProbe {
    fn drop(&mut self) {
        if let Some(client) = &self.client {
            let _ = client.close(&self.job);
        }
        if let Some((runtime, started)) = self.own.take() {
            {
                let _in = runtime.enter();
                started.stop();
            }
            runtime.shutdown_background();
        }
    }
}
