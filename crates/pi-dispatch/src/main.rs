//! `pi-dispatch`: the command line. Each subcommand lives in its own module under `cmd/`; this file
//! only parses arguments, runs the subcommand and maps its outcome to an exit code.

mod cmd;
mod context;
mod exit;
mod output;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::exit::Exit;

/// Runs the pi coding agent unattended against repositories, with exactly the MCP servers a
/// trigger names.
#[derive(Debug, Parser)]
#[command(name = "pi-dispatch", version, about, propagate_version = true)]
struct Cli {
    /// The deployment folder, where .env and the other files are [default: the current folder]
    #[arg(long, global = true, value_name = "DIR")]
    dir: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check the deployment: settings, overlay, MCP servers, egress files.
    Doctor(cmd::doctor::Args),
    /// Say what pickup would decide now for the job a trigger would queue, without running it.
    Explain(cmd::explain::Args),
    /// Job images of the embedded backend (folders under images/).
    Image(cmd::image::Args),
    /// Stage the host's pi setup (mcp.json, models.json, skills/, APPEND_SYSTEM.md) into the overlay.
    ImportPi(cmd::import_pi::Args),
    /// The job's runner, inside the sandbox: connect the job's MCP servers and start the agent.
    Job(cmd::job::Args),
    /// Started by the job's runner: ends the job's processes if the runner is killed.
    #[command(hide = true)]
    JobGuard(cmd::job::GuardArgs),
    /// Queue a local job on a repository folder.
    Run(cmd::run::Args),
    /// The queue: what waits, what runs, what was done lately.
    Status(cmd::status::Args),
    /// Run the queue's jobs, each in its own sandbox, and record them.
    Worker(cmd::worker::Args),
    /// The run records: one per job, what happened and what it used.
    Runs(cmd::runs::Args),
    /// Write the deployment folder's missing files (.env, triggers.json, egress files, overlay).
    Init(cmd::init::Args),
    /// MCP servers offered in the overlay's mcp.json.
    Mcp {
        #[command(subcommand)]
        command: McpCommand,
    },
    /// The triggers file: which events queue which jobs.
    Triggers {
        #[command(subcommand)]
        command: TriggersCommand,
    },
}

#[derive(Debug, Subcommand)]
enum McpCommand {
    /// Check the overlay's mcp.json: which servers it offers and why it refuses the others.
    Check(cmd::mcp_check::Args),
}

#[derive(Debug, Subcommand)]
enum TriggersCommand {
    /// Check triggers.json: every trigger valid, or every error by trigger and field.
    Check(cmd::triggers_check::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    let ctx = match context::Context::new(cli.dir.as_deref()) {
        Ok(ctx) => ctx,
        Err(e) => return Exit::from_error(&e),
    };
    let result = match cli.command {
        Command::Init(args) => cmd::init::run(&args, &ctx),
        Command::Job(args) => cmd::job::run(&args, &ctx),
        Command::JobGuard(args) => cmd::job::guard(&args),
        Command::Doctor(args) => cmd::doctor::run(&args, &ctx),
        Command::Runs(args) => cmd::runs::run(&args, &ctx),
        Command::Run(args) => cmd::run::run(&args, &ctx),
        Command::Status(args) => cmd::status::run(&args, &ctx),
        Command::Worker(args) => cmd::worker::run(&args, &ctx),
        Command::Image(args) => cmd::image::run(&args, &ctx),
        Command::Explain(args) => cmd::explain::run(&args, &ctx),
        Command::ImportPi(args) => cmd::import_pi::run(&args, &ctx),
        Command::Mcp {
            command: McpCommand::Check(args),
        } => cmd::mcp_check::run(&args, &ctx),
        Command::Triggers {
            command: TriggersCommand::Check(args),
        } => cmd::triggers_check::run(&args, &ctx),
    };
    match result {
        Ok(exit) => exit.into(),
        Err(e) => Exit::from_error(&e),
    }
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
