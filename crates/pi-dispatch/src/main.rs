//! `pi-dispatch`: the command line. Each subcommand lives in its own module under `cmd/`; this file
//! only parses arguments, runs the subcommand and maps its outcome to an exit code.

mod cmd;
mod context;
mod exit;
mod output;
mod record_text;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::exit::Exit;

/// `--version`: the crate's version, the commit it was built from and the pi the job image pins
/// (see `build.rs`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PI_DISPATCH_COMMIT"),
    ", pi ",
    env!("PI_DISPATCH_PI_VERSION"),
    ")"
);

/// Runs the pi coding agent unattended against repositories, with exactly the MCP servers a
/// trigger names.
#[derive(Debug, Parser)]
#[command(name = "pi-dispatch", version = VERSION, about, propagate_version = true)]
struct Cli {
    /// The deployment folder, where .env and the other files are [default: PI_DIR, else the
    /// current folder]
    #[arg(
        long,
        global = true,
        value_name = "DIR",
        env = "PI_DIR",
        hide_env = true
    )]
    dir: Option<std::path::PathBuf>,
    /// How log lines are written to standard error (each with an RFC 3339 timestamp).
    #[arg(long, global = true, value_name = "FORMAT", default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The commands, in the order an operator meets them.
#[derive(Debug, Subcommand)]
enum Command {
    /// Write the deployment folder's missing files (.env, triggers.json, egress files, overlay).
    Init(cmd::init::Args),
    /// Stage the host's pi setup (mcp.json, models.json, skills/, APPEND_SYSTEM.md) into the overlay.
    ImportPi(cmd::import_pi::Args),
    /// Check the deployment: settings, overlay, MCP servers, models, egress files, what jobs would do.
    Doctor(cmd::doctor::Args),
    /// Job images of the embedded backend (folders under images/).
    Image(cmd::image::Args),
    /// Queue a job: a local one on a repository folder, or a trigger's now (refused at once when it is certain to be).
    Run(cmd::run::Args),
    /// Run the queue's jobs, each in its own sandbox, and record them.
    Worker(cmd::worker::Args),
    /// Take GitHub and GitLab webhooks and queue the jobs of the triggers they match.
    Receiver(cmd::receiver::Args),
    /// The egress proxy of jobs with egress on (the worker starts one when none is running).
    EgressProxy(cmd::egress_proxy::Args),
    /// The web panel: the queue, the runs and why each ended, health, metrics (PI_PANEL_TOKEN).
    Panel(cmd::panel::Args),
    /// The queue: what waits, what runs (where, for how long), what was done lately.
    Status(cmd::status::Args),
    /// The run records: one per job, what happened, why, and what it used.
    Runs(cmd::runs::Args),
    /// Cancel a job: a queued one is removed, a running one is stopped.
    Cancel(cmd::cancel::Args),
    /// Queue a job that runs an ended job again, under its trigger's policy as it is now.
    ///
    /// The new job has the ended job's task, folder or forge event, and takes its trigger's
    /// run.mcp, run.models, run.maxCostUsd, run.excludeTools and run.labels as triggers.json has
    /// them now (where both the job and the trigger set one, the stricter: the servers and models
    /// both name, the lower cap, every excluded tool and label). Egress is the deployment's
    /// setting now. It goes through the admission as any job: a job whose trigger is gone, or
    /// whose place in triggers.json another trigger took, is refused (trigger-gone). Retries of a
    /// job are held to the trigger as it is at each attempt the same way.
    Rerun(cmd::rerun::Args),
    /// Remove now what jobs left past the PI_KEEP_*_DAYS settings (the worker does it as it goes).
    Prune(cmd::prune::Args),
    /// Say what the worker would decide now for the job a trigger would queue, without running it.
    Explain(cmd::explain::Args),
    /// The triggers file: which events queue which jobs.
    Triggers {
        #[command(subcommand)]
        command: TriggersCommand,
    },
    /// MCP servers offered in the overlay's mcp.json.
    Mcp {
        #[command(subcommand)]
        command: McpCommand,
    },
    /// Print a shell's completion script (bash: `source <(pi-dispatch completions bash)`).
    Completions(cmd::completions::Args),
    /// Print the manual page (roff), made from these same definitions.
    #[command(hide = true)]
    ManPage,
    /// The job's runner, inside the sandbox: connect the job's MCP servers and start the agent.
    #[command(hide = true)]
    Job(cmd::job::Args),
    /// Started by the job's runner: ends the job's processes if the runner is killed.
    #[command(hide = true)]
    JobGuard(cmd::job::GuardArgs),
}

#[derive(Debug, Subcommand)]
enum McpCommand {
    /// Check the overlay's mcp.json: which servers it offers and why it refuses the others.
    Check(cmd::mcp_check::Args),
    /// The servers' pins: what each listed when approved, and what jobs saw differ since.
    Pins(cmd::mcp_pins::PinsArgs),
    /// Approve what a server lists now as its pin, connecting it as a job would.
    Pin(cmd::mcp_pins::PinArgs),
}

#[derive(Debug, Subcommand)]
enum TriggersCommand {
    /// Check triggers.json: every trigger valid, or every error by trigger and field.
    Check(cmd::triggers_check::Args),
}

fn main() -> ExitCode {
    // Inside a job, between the runner and what it starts: no settings, no logs, the program's
    // own exit status.
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(exit) = in_job(&raw) {
        return exit;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    // Made from the definitions alone: no deployment, no logs.
    let made = match &cli.command {
        Command::Completions(args) => Some(cmd::completions::completions(args)),
        Command::ManPage => Some(cmd::completions::man_page()),
        _ => None,
    };
    if let Some(result) = made {
        return match result {
            Ok(exit) => exit.into(),
            Err(e) => Exit::from_error(&e),
        };
    }
    init_logs(cli.log_format);
    let mut ctx = match context::Context::new(cli.dir.as_deref()) {
        Ok(ctx) => ctx,
        Err(e) => return Exit::from_error(&e),
    };
    ctx.log_format = match cli.log_format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    };
    match run(cli.command, &ctx) {
        Ok(exit) => exit.into(),
        Err(e) => Exit::from_error(&e),
    }
}

/// A helper a job runs (pi's shell, `job-confine`, ...), when `raw` names one: run, and its
/// exit status.
fn in_job(raw: &[std::ffi::OsString]) -> Option<ExitCode> {
    // pi's shell: the job image's read-only link to this program, run as `SHELL -c COMMAND`.
    let called = raw
        .first()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name);
    if called == Some(std::ffi::OsStr::new(hub::pi_agent::SHELL_NAME)) {
        return Some(cmd::job::shell(&raw[1..]));
    }
    Some(match raw.get(1).and_then(|a| a.to_str()) {
        Some("job-confine") => cmd::job::confine(&raw[2..]),
        Some("job-shell") => cmd::job::shell(&raw[2..]),
        Some("job-relay") => hub::pi_relay::main(&raw[2..]),
        Some("job-env") => sandbox::launcher::main(&raw[2..]),
        Some("job-limits") => sandbox::cgroup::limits_main(&raw[2..]),
        _ => return None,
    })
}

/// Runs a subcommand on the deployment `ctx` names.
fn run(command: Command, ctx: &context::Context) -> anyhow::Result<Exit> {
    match command {
        Command::Init(args) => cmd::init::run(&args, ctx),
        Command::Job(args) => cmd::job::run(&args, ctx),
        Command::JobGuard(args) => cmd::job::guard(&args),
        Command::Doctor(args) => cmd::doctor::run(&args, ctx),
        Command::Runs(args) => cmd::runs::run(&args, ctx),
        Command::Run(args) => cmd::run::run(&args, ctx),
        Command::Status(args) => cmd::status::run(&args, ctx),
        Command::Worker(args) => cmd::worker::run(&args, ctx),
        Command::Receiver(args) => cmd::receiver::run(&args, ctx),
        Command::Panel(args) => cmd::panel::run(&args, ctx),
        Command::EgressProxy(args) => cmd::egress_proxy::run(&args, ctx),
        Command::Image(args) => cmd::image::run(&args, ctx),
        Command::Explain(args) => cmd::explain::run(&args, ctx),
        Command::Cancel(args) => cmd::cancel::run(&args, ctx),
        Command::Rerun(args) => cmd::rerun::run(&args, ctx),
        Command::Prune(args) => cmd::prune::run(&args, ctx),
        Command::ImportPi(args) => cmd::import_pi::run(&args, ctx),
        Command::Mcp {
            command: McpCommand::Check(args),
        } => cmd::mcp_check::run(&args, ctx),
        Command::Mcp {
            command: McpCommand::Pins(args),
        } => cmd::mcp_pins::pins(&args, ctx),
        Command::Mcp {
            command: McpCommand::Pin(args),
        } => cmd::mcp_pins::pin(&args, ctx),
        Command::Triggers {
            command: TriggersCommand::Check(args),
        } => cmd::triggers_check::run(&args, ctx),
        // Answered above, before any deployment is read.
        Command::Completions(_) | Command::ManPage => Ok(Exit::Success),
    }
}

/// Log lines go to standard error, one per event, each with its RFC 3339 time (UTC) and level.
fn init_logs(format: LogFormat) {
    // A log line that cannot be written (standard error full or closed) is dropped: the
    // subscriber's own report of it would be written to standard error with `eprintln!`, which
    // panics there, and a worker must go on (and still stop when told).
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_target(false)
        .with_ansi(false);
    let _ = match format {
        LogFormat::Text => builder.fmt_fields(logfmt_fields()).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// The text format's fields as `key=value`, each value bare when it is one plain word and
/// otherwise quoted with its quotes, backslashes and control characters escaped, so that a line
/// reads back as logfmt whatever a value holds (an error with spaces, a path with `=`).
fn logfmt_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> {
    use tracing_subscriber::field::MakeExt as _;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = format!("{value:?}");
        // A string field is written with Debug's quotes and escapes already.
        let quoted = text.len() >= 2 && text.starts_with('"') && text.ends_with('"');
        let plain = !text.is_empty()
            && text
                .chars()
                .all(|c| !c.is_whitespace() && !c.is_control() && !"\"=\\".contains(c));
        if quoted || plain {
            write!(w, "{field}={text}")
        } else {
            write!(w, "{field}={text:?}")
        }
    })
    .delimited(" ")
}

/// Prints a usage error (or help, or the version) and exits: 2 for misuse, except that `import-pi`
/// refuses an unknown flag with 1, as the product's conventions have it for that command.
fn usage_error(e: &clap::Error) -> ExitCode {
    let _ = e.print();
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
        ErrorKind::UnknownArgument if std::env::args().any(|a| a == "import-pi") => {
            Exit::CheckFailed.into()
        }
        _ => Exit::Unusable.into(),
    }
}
