//! `pi-dispatch run FOLDER --task TEXT [--flow F] [--mcp NAME,…] [--image NAME] [--force]`: queues
//! a local job on the repository in FOLDER. The job works in the folder itself, so a git tree with
//! uncommitted changes is refused unless `--force`. The worker (`pi-dispatch worker`) runs it.
//! `pi-dispatch run --trigger N` queues now the job cron trigger N queues on its schedule;
//! `pi-dispatch run --trigger N --event FILE` queues the job forge trigger N queues for the event
//! in FILE (a webhook's body as the forge sends it), read as the receiver reads it.
//!
//! Before queueing, `run` asks the admission the worker asks: a job certain to be refused (an
//! unknown server, a folder owned by root, a model without its key, ...) is not queued, and the
//! refusal is said with its fix.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use pickup::admission::Decision;
use protocol::job::{Job, McpField};

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The repository folder the job works in.
    #[arg(required_unless_present = "trigger")]
    folder: Option<PathBuf>,
    /// What the agent is asked to do.
    #[arg(long, value_name = "TEXT", required_unless_present = "trigger")]
    task: Option<String>,
    /// Queue the job of cron trigger N of triggers.json now (its folder, task, servers, secrets),
    /// or, with --event, of forge trigger N.
    #[arg(long, value_name = "N", conflicts_with_all = ["folder", "task", "mcp", "image"])]
    trigger: Option<usize>,
    /// With --trigger N, a forge trigger: the event to run it on, a webhook's body as the forge
    /// sends it (saved from the forge's webhook deliveries page, say). The trigger must match it.
    #[arg(long, value_name = "FILE", requires = "trigger")]
    event: Option<PathBuf>,
    /// The flow the job follows.
    #[arg(long, value_name = "NAME", default_value = "task")]
    flow: String,
    /// MCP servers of the overlay the job connects, comma-separated.
    #[arg(long, value_name = "NAME,…", value_delimiter = ',')]
    mcp: Vec<String>,
    /// The job image (images/NAME) [default: PI_JOB_IMAGE, else pi-job].
    #[arg(long, value_name = "NAME")]
    image: Option<String>,
    /// Queue the job even though the folder has uncommitted changes.
    #[arg(long)]
    force: bool,
}

/// A new job id: the time and 6 random bytes.
pub fn new_job_id(prefix: &str) -> anyhow::Result<String> {
    let random = protocol::ids::random_hex::<6>()
        .map_err(|e| anyhow::anyhow!("a job id cannot be made: {e}"))?;
    let ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    Ok(format!("{prefix}-{ms}-{random}"))
}

/// Whether the git work tree at `folder` has changes not committed (untracked files count).
///
/// A job can write the repository, its `.git/config` included (a clean filter, a hook for
/// file-system monitoring), so git never runs on it on the host: it runs in a sandbox of its own
/// (`sandbox::isolated`) with the folder read-only, its own `/proc`, no network, nothing of this
/// process's environment, as the folder's owner when this is root (a folder its owner cannot read,
/// write or enter is refused first, saying so), for at most `limit`.
pub(crate) fn dirty(folder: &Path, limit: std::time::Duration) -> anyhow::Result<bool> {
    use sandbox::{bwrap, isolated};
    let shown = folder.display();
    if folder.as_os_str().is_empty() {
        anyhow::bail!("the job names no folder: a local job works on a repository");
    }
    let opened = bwrap::open_folder(folder)
        .map_err(|e| anyhow::anyhow!("{shown} cannot be used as a folder ({})", e.kind()))?;
    let owner = git_user(folder, &opened)?;
    let args: Vec<std::ffi::OsString> = [
        "-c",
        "core.fsmonitor=false",
        "-c",
        "core.untrackedCache=false",
        "-c",
        "safe.directory=*",
        "status",
        "--porcelain",
        "--untracked-files=normal",
    ]
    .iter()
    .map(Into::into)
    .collect();
    let out = isolated::run(isolated::Step {
        bwrap: Path::new(bwrap::BWRAP),
        folder: opened,
        user: owner,
        program: std::ffi::OsStr::new("git"),
        args,
        env: vec![
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
            ("HOME", "/tmp"),
            ("LC_ALL", "C"),
            ("GIT_OPTIONAL_LOCKS", "0"),
            ("GIT_CONFIG_NOSYSTEM", "1"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
            ("GIT_TERMINAL_PROMPT", "0"),
        ],
        time: limit,
        stdout_kept: 1,
    })
    .map_err(|e| anyhow::anyhow!("git could not check {shown} for uncommitted changes: {e}"))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        let said: String = said
            .lines()
            .next()
            .unwrap_or("no message")
            .replace(isolated::FOLDER, &shown.to_string())
            .chars()
            .filter(|c| !c.is_control())
            .take(300)
            .collect();
        anyhow::bail!(
            "{shown} is not a git work tree that git can read ({said}): a local job works on a repository"
        );
    }
    Ok(out.stdout_len > 0)
}

/// Whom git runs as on `folder` (opened as `opened`): its owner when this is root and the owner
/// is not, once the owner is seen to reach it as a job's workspace; else `None`, this process's
/// user.
fn git_user(folder: &Path, opened: &std::os::fd::OwnedFd) -> anyhow::Result<Option<(u32, u32)>> {
    use pickup::reach;
    let meta = rustix::fs::fstat(opened)?;
    let (uid, gid) = (meta.st_uid, meta.st_gid);
    if !rustix::process::geteuid().is_root() || uid == 0 {
        return Ok(None);
    }
    let owner = reach::User {
        uid,
        gid,
        groups: Vec::new(),
    };
    let found = reach::Folder {
        mode: meta.st_mode,
        uid,
        gid,
    };
    let passwd = std::fs::read_to_string("/etc/passwd").ok();
    reach::check(folder, &found, &owner, &reach::WORKSPACE, passwd.as_deref())
        .map_err(|e| anyhow::anyhow!("{e}; a local job works in its folder as its owner"))?;
    Ok(Some((uid, gid)))
}

/// The job cron trigger `index` queues, with a fresh id.
pub(crate) fn trigger_job(ctx: &Context, index: usize) -> anyhow::Result<Job> {
    let settings = ctx.settings()?;
    let all = config::triggers::TriggersFile::read(&settings.triggers_file)?;
    let trigger = all
        .trigger(index)
        .map_err(|why| anyhow::anyhow!("--trigger: {why}"))?;
    let config::triggers::On::Cron { id, .. } = &trigger.on else {
        anyhow::bail!(
            "--trigger: trigger {index} is not a cron trigger; a forge trigger runs on an event: add --event FILE"
        );
    };
    Ok(trigger.job(new_job_id(&format!("cron-{id}-now"))?))
}

/// The job forge trigger `index` queues for the webhook body in `file`, read as the receiver reads
/// a delivery (the event named by what the body holds), or why there is none.
fn event_job(ctx: &Context, index: usize, file: &Path) -> anyhow::Result<Result<Job, String>> {
    use protocol::forge_event::Forge;
    use receiver::payload::Parsed;
    let settings = ctx.settings()?;
    let all = config::triggers::TriggersFile::read(&settings.triggers_file)?;
    let trigger = all
        .trigger(index)
        .map_err(|why| anyhow::anyhow!("--trigger: {why}"))?;
    let Some(forge) = Forge::of_kind(trigger.run.kind.as_str()) else {
        return Ok(Err(format!(
            "--event: trigger {index} runs a {} job, and only a github or gitlab trigger takes an event",
            trigger.run.kind.as_str()
        )));
    };
    let shown = file.display();
    let body = read_bounded(file, receiver::server::DEFAULT_MAX_BODY)
        .map_err(|e| anyhow::anyhow!("--event: {shown} cannot be read ({e})"))?;
    let Some(name) = receiver::payload::event_of_body(forge, &body) else {
        return Ok(Err(format!(
            "--event: {shown} is not a {forge} webhook body of an event a trigger can name"
        )));
    };
    let delivery = new_job_id("cli")?;
    let parsed = match forge {
        Forge::Github => receiver::github::parse(name, &delivery, &body),
        Forge::Gitlab => receiver::gitlab::parse(name, &delivery, &body),
    };
    let event = match parsed {
        Ok(Parsed::Event(event)) => event,
        Ok(Parsed::Ping) => return Ok(Err(format!("--event: {shown} is a ping, not an event"))),
        Ok(Parsed::Ignored(why)) => {
            return Ok(Err(format!("--event: the receiver would ignore it: {why}")));
        }
        Err(e) => return Ok(Err(format!("--event: {shown}: {e}"))),
    };
    if !receiver::matching::matches(trigger, &event) {
        return Ok(Err(format!(
            "--event: trigger {index} does not match this {name} event, so a delivery of it would queue nothing (pi-dispatch explain --trigger {index} shows what it takes)"
        )));
    }
    Ok(Ok(Job {
        event: Some(*event.clone()),
        ..trigger.job(receiver::matching::job_id(&event, index))
    }))
}

/// The file at `path`, refused when larger than `max` bytes.
fn read_bounded(path: &Path, max: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max as u64 + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() > max {
        return Err(std::io::Error::other(format!("larger than {max} bytes")));
    }
    Ok(bytes)
}

/// What came of asking to queue a job.
pub enum Queued {
    /// Queued; with what could not be checked now, when something could not.
    Yes {
        id: String,
        unchecked: Option<String>,
    },
    /// The admission refuses it now: nothing was queued.
    Refused(Box<pickup::admission::Refusal>),
}

/// Queues `job` unless the admission refuses it now. A local job is this host's (its folder is
/// here) unless its trigger asks for labels.
pub fn queue_job(ctx: &Context, job: &Job) -> anyhow::Result<Queued> {
    let settings = ctx.settings()?;
    let env = ctx.environment()?;
    let unchecked = match pickup::fs::Deployment::new(&settings, &env).decide(job) {
        Decision::Refuse(r) => return Ok(Queued::Refused(r)),
        Decision::Retry { detail } => Some(detail),
        Decision::Admit(_) => None,
    };
    let queue = ctx.queue(&settings)?;
    let mut job = job.clone();
    if job.kind() == Some(protocol::job::Kind::Local) {
        job.host = Some(settings.host_name());
    }
    queue.enqueue_job(&queue::NewJob::of(&job)?, SystemTime::now())?;
    Ok(Queued::Yes {
        id: job.id,
        unchecked,
    })
}

/// Queues `job` unless the admission refuses it now: then nothing is queued, and the refusal is
/// said as the worker would record it.
fn enqueue(ctx: &Context, job: &Job) -> anyhow::Result<Exit> {
    match queue_job(ctx, job)? {
        Queued::Refused(r) => {
            eprint!("{}", refusal_text(&r));
            Ok(Exit::CheckFailed)
        }
        Queued::Yes { id, unchecked } => {
            if let Some(detail) = unchecked {
                eprintln!(
                    "pi-dispatch: a check could not be made now ({detail}); the job is queued and the worker decides when it can"
                );
            }
            crate::output::print(&format!(
                "Queued {id} (run pi-dispatch worker to run it; pi-dispatch runs show {id} for its record).\n"
            ))?;
            Ok(Exit::Success)
        }
    }
}

/// A refusal as `run` says it: the reason and its sentence, what it concerns, and the fix.
pub fn refusal_text(r: &pickup::admission::Refusal) -> String {
    format!(
        "pi-dispatch: the job would be refused, so it is not queued: {} ({})\n  why: {}\n  fix: {}\n",
        r.reason,
        r.sentence(),
        r.detail.why,
        r.fix
    )
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    ctx.deployment()?;
    let check_limit = std::time::Duration::from_secs(ctx.settings()?.run_check_secs);
    if let (Some(index), Some(file)) = (args.trigger, &args.event) {
        return match event_job(ctx, index, &ctx.absolute(file))? {
            Ok(job) => enqueue(ctx, &job),
            Err(why) => {
                eprintln!("pi-dispatch: {why}");
                Ok(Exit::CheckFailed)
            }
        };
    }
    if let Some(index) = args.trigger {
        let job = trigger_job(ctx, index)?;
        let folder = PathBuf::from(job.folder.clone().unwrap_or_default());
        if dirty(&folder, check_limit)? && !args.force {
            eprintln!(
                "pi-dispatch: the trigger's folder {} has uncommitted changes, and the job would work among them; commit or stash them, or pass --force",
                folder.display()
            );
            return Ok(Exit::CheckFailed);
        }
        return enqueue(ctx, &job);
    }
    let settings = ctx.settings()?;
    let (Some(folder), Some(task)) = (&args.folder, &args.task) else {
        anyhow::bail!("FOLDER and --task are needed (or --trigger N)");
    };
    // Messages name the folder as it was given.
    let given = folder.display();
    let folder = ctx
        .absolute(folder)
        .canonicalize()
        .map_err(|e| anyhow::anyhow!("the folder {given} cannot be used ({})", e.kind()))?;
    if !folder.is_dir() {
        anyhow::bail!("{given} is not a folder: a local job works in a repository's folder");
    }
    let Some(folder_text) = folder.to_str().map(str::to_owned) else {
        anyhow::bail!("the path of {given} must be UTF-8 text");
    };
    if task.trim().is_empty() {
        anyhow::bail!("--task must say what the agent is asked to do");
    }
    if dirty(&folder, check_limit)? && !args.force {
        eprintln!(
            "pi-dispatch: {given} has uncommitted changes, and the job would work among them; commit or stash them, or pass --force"
        );
        return Ok(Exit::CheckFailed);
    }
    let job = Job {
        flow: Some(args.flow.clone()),
        mcp: (!args.mcp.is_empty()).then(|| McpField::names(args.mcp.iter().map(String::as_str))),
        provider: settings.provider.clone(),
        model: settings.model.clone(),
        image: args.image.clone(),
        folder: Some(folder_text),
        task: Some(task.clone()),
        ..Job::new(new_job_id("cli")?, "cli", "local")
    };
    enqueue(ctx, &job)
}
