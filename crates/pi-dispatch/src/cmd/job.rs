//! `pi-dispatch job [--job-dir DIR] [--workspace DIR] [--agent-dir DIR] -- AGENT...`: the job's
//! runner, inside the sandbox. It reads the per-job key from its standard input (one line) and
//! what the worker tells it from the job folder's `runner.json`, connects the job's MCP servers,
//! serves them to the agent it starts, and prints the signed exit line as its last line of output.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The job's folder (runner.json, mcp.json and the job's other files).
    #[arg(long, value_name = "DIR", default_value = "/job")]
    job_dir: PathBuf,
    /// Where the servers and the agent run.
    #[arg(long, value_name = "DIR", default_value = "/workspace")]
    workspace: PathBuf,
    /// pi's private agent folder [default: $HOME/.pi-dispatch/agent]
    #[arg(long, value_name = "DIR")]
    agent_dir: Option<PathBuf>,
    /// Run real pi from this package folder (`@earendil-works/pi-coding-agent`) instead of a
    /// command given after `--`.
    #[arg(long, value_name = "DIR", conflicts_with = "agent")]
    pi: Option<PathBuf>,
    /// The Node.js binary pi runs on [default: node, from PATH].
    #[arg(long, value_name = "FILE", requires = "pi")]
    node: Option<PathBuf>,
    /// pi's prompt [default: the job folder's prompt.md].
    #[arg(long, value_name = "FILE", requires = "pi")]
    prompt: Option<PathBuf>,
    /// pi's model, as provider/model [default: PI_PROVIDER and PI_MODEL].
    #[arg(long, value_name = "MODEL", requires = "pi")]
    model: Option<String>,
    /// The overlay pi takes models.json, APPEND_SYSTEM.md, skills and extensions from.
    #[arg(long, value_name = "DIR", default_value = "/opt/pi-global")]
    overlay: PathBuf,
    /// Start pi and each stdio server in namespaces of their own (the worker's jobs do): the
    /// sandbox must give the runner the capabilities for it (docs/sandbox.md).
    #[arg(long)]
    confine: bool,
    /// The agent's command line.
    #[arg(last = true, value_name = "AGENT")]
    agent: Vec<String>,
}

/// pi's model: the flag, else `PI_PROVIDER` and `PI_MODEL` from the job's environment.
fn model(args: &Args, ctx: &Context) -> Option<String> {
    args.model.clone().or_else(|| {
        let model = ctx.env("PI_MODEL").filter(|m| !m.is_empty())?;
        Some(match ctx.env("PI_PROVIDER").filter(|p| !p.is_empty()) {
            Some(provider) => format!("{provider}/{model}"),
            None => model,
        })
    })
}

/// No process of a job leaves a core file: its memory holds the job's credentials (pi's the hub's
/// token, a server's its own). The hard limit is lowered too, which no process of the job can
/// raise again (that takes a capability in the host's own user namespace).
pub fn no_core_files() -> anyhow::Result<()> {
    let none = rustix::process::Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    rustix::process::setrlimit(rustix::process::Resource::Core, none)
        .map_err(|e| anyhow::anyhow!("core files cannot be turned off ({e})"))
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    no_core_files()?;
    // In a container the engine grants no capability: the runner makes the user namespace
    // bubblewrap makes for a nested job (before anything starts a thread, and while it may still
    // write its own maps).
    if args.confine {
        hub::confine::own_user_namespace().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    // The runner holds every MCP credential and the job's key: nothing else in the job (same
    // user) may read its environment or memory through /proc, or attach to it.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| anyhow::anyhow!("the runner cannot protect its memory ({e})"))?;
    // What no process of the job may call, from before anything of the job runs.
    hub::syscalls::install(hub::syscalls::Filter::Runner).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut key = String::new();
    std::io::stdin().lock().read_line(&mut key)?;
    let key = key.trim_end_matches(['\n', '\r']).to_owned();
    if key.is_empty() {
        anyhow::bail!("no job key on standard input");
    }
    let home = ctx.env("HOME").unwrap_or_else(|| "/tmp".to_owned());
    let job_dir = ctx.absolute(&args.job_dir);
    let job_id = ctx
        .env(sandbox::env::JOB_ID)
        .unwrap_or_else(|| "job".to_owned());
    let input = match protocol::job_dir::RunnerInput::read(&job_dir) {
        Ok(input) => input,
        Err(e) => return exit(&hub::job::setup_failed(&job_id, e.to_string()), &key),
    };
    let options = hub::job::JobOptions {
        job_id,
        input,
        job_dir: job_dir.clone(),
        workspace: ctx.absolute(&args.workspace),
        agent_dir: args
            .agent_dir
            .as_ref()
            .map(|d| ctx.absolute(d))
            .unwrap_or_else(|| PathBuf::from(home).join(".pi-dispatch/agent")),
        agent: match &args.pi {
            Some(package) => hub::job::Agent::Pi(hub::pi_agent::PiOptions {
                node: args
                    .node
                    .as_ref()
                    .map_or_else(|| PathBuf::from("node"), |n| ctx.absolute(n)),
                package: ctx.absolute(package),
                prompt: args.prompt.as_ref().map_or_else(
                    || job_dir.join(protocol::job_dir::PROMPT),
                    |p| ctx.absolute(p),
                ),
                model: model(args, ctx),
                overlay: Some(ctx.absolute(&args.overlay)),
                compile_cache: image_compile_cache(&ctx.absolute(package)),
            }),
            None => hub::job::Agent::Command(args.agent.clone()),
        },
        env: std::env::vars().collect(),
        guard: std::env::current_exe().ok(),
        relay: match &args.pi {
            Some(_) => Some(std::env::current_exe()?),
            None => None,
        },
        confine: if args.confine {
            Some(std::env::current_exe()?)
        } else {
            None
        },
        key: Some(key.clone()),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(hub::job::RUNTIME_WORKERS)
        .enable_all()
        .build()?;
    let line = runtime.block_on(hub::job::run(options));
    let exit = exit(&line, &key);
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    exit
}

/// Prints the exit line, signed with the job's key, as the runner's last line.
fn exit(line: &protocol::exit_line::ExitLine, key: &str) -> anyhow::Result<Exit> {
    let text = protocol::exit_line::sign(line, key.as_bytes())?;
    crate::output::print(&format!("{text}\n"))?;
    Ok(match line.code {
        0 => Exit::Success,
        1 => Exit::CheckFailed,
        _ => Exit::Unusable,
    })
}

/// `pi-dispatch job-guard --runner-pid PID` (hidden): started by the runner; when the runner's pipe
/// closes, ends every process the runner started.
#[derive(Debug, clap::Args)]
pub struct GuardArgs {
    #[arg(long)]
    runner_pid: u32,
}

pub fn guard(args: &GuardArgs) -> anyhow::Result<Exit> {
    hub::guard::watch(args.runner_pid);
    Ok(Exit::Success)
}

/// `pi-dispatch job-confine [--init] [--keep-marker] [--private-tmp] -- PROGRAM ARGS...` (hidden):
/// started by the runner for pi and each stdio server, runs the program in namespaces of its own
/// (`sandbox::confine`) and exits with its status.
pub fn confine(args: &[std::ffi::OsString]) -> std::process::ExitCode {
    let mut c = hub::confine::Confinement::default();
    let mut init = false;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.to_str() {
            Some("--init") => init = true,
            Some("--keep-marker") => c.keep_marker = true,
            Some("--private-tmp") => c.private_tmp = true,
            Some("--read-only") => match rest.next() {
                Some(folder) => c.read_only.push(folder.into()),
                None => break,
            },
            Some("--pin") => match rest.next() {
                Some(folder) => c.pinned.push(folder.into()),
                None => break,
            },
            Some("--") => break,
            _ => {
                eprintln!(
                    "pi-dispatch: job-confine takes --init, --keep-marker, --private-tmp, --pin FOLDER, --read-only PATH, then -- and a program"
                );
                return Exit::Unusable.into();
            }
        }
    }
    let rest: Vec<std::ffi::OsString> = rest.cloned().collect();
    let Some((program, args)) = rest.split_first() else {
        eprintln!("pi-dispatch: job-confine needs a program after --");
        return Exit::Unusable.into();
    };
    let done = if init {
        hub::confine::init(&c, program, args)
    } else {
        hub::confine::outer(&c, program, args)
    };
    match done {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => hub::confine::failed(&e),
    }
}

/// `pi-dispatch job-shell ARGS...` (hidden): pi's shell inside a job. Gives up every capability
/// (so that the command cannot trace pi or read its memory or environment) and the hub's token,
/// then runs bash with pi's arguments.
pub fn shell(args: &[std::ffi::OsString]) -> std::process::ExitCode {
    use std::os::unix::process::CommandExt as _;
    if let Err(e) = hub::confine::drop_all() {
        return hub::confine::failed(&e);
    }
    // In a job, the runner runs the command apart from pi (`hub::tools`); it never runs here.
    if let Some(socket) = std::env::var_os(hub::tools::SOCKET_VARIABLE) {
        let argv: Option<Vec<String>> = std::iter::once(std::ffi::OsString::from("bash"))
            .chain(args.iter().cloned())
            .map(|a| a.into_string().ok())
            .collect();
        let cwd = std::env::current_dir()
            .ok()
            .and_then(|d| d.into_os_string().into_string().ok());
        let (Some(argv), Some(cwd)) = (argv, cwd) else {
            eprintln!("pi-dispatch: pi's shell takes UTF-8 arguments and a UTF-8 working folder");
            return std::process::ExitCode::from(126);
        };
        let env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| k != hub::pi_config::HUB_TOKEN_VARIABLE)
            .collect();
        let request = hub::tools::Request { argv, cwd, env };
        return match hub::tools::run(std::path::Path::new(&socket), &request) {
            Ok(code) => std::process::ExitCode::from(u8::try_from(code).unwrap_or(1)),
            Err(e) => {
                eprintln!(
                    "pi-dispatch: pi's shell cannot reach the runner ({})",
                    e.kind()
                );
                std::process::ExitCode::from(126)
            }
        };
    }
    let error = std::process::Command::new("bash")
        .args(args)
        .env_remove(hub::pi_config::HUB_TOKEN_VARIABLE)
        .exec();
    eprintln!(
        "pi-dispatch: pi's shell cannot start bash ({})",
        error.kind()
    );
    std::process::ExitCode::from(127)
}

/// The compile cache of the image pi's package is in (`setup::image::COMPILE_CACHE`), when the
/// package is where an image has it and the image has one.
fn image_compile_cache(package: &Path) -> Option<PathBuf> {
    let mut root = package;
    for _ in Path::new(setup::image::PI_PACKAGE).components() {
        root = root.parent()?;
    }
    (root.join(setup::image::PI_PACKAGE) == package)
        .then(|| root.join(setup::image::COMPILE_CACHE))
        .filter(|cache| cache.is_dir())
}
