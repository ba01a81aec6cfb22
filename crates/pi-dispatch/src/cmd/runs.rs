//! `pi-dispatch runs [--json]` lists the run records of the deployment (`state/runs/`), oldest
//! first; `pi-dispatch runs show ID` prints one record as it is stored.

use worker::record::{RecordError, Records};

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the records as a JSON array.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    command: Option<RunsCommand>,
}

#[derive(Debug, clap::Subcommand)]
enum RunsCommand {
    /// Print one job's record.
    Show {
        /// The job's id.
        id: String,
    },
}

/// The records folder of the deployment.
pub fn records(ctx: &Context) -> Records {
    Records::new(ctx.dir.join("state").join("runs"))
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    let records = records(ctx);
    if let Some(RunsCommand::Show { id }) = &args.command {
        return match records.read(id) {
            Ok(record) => {
                crate::output::print(&format!("{}\n", serde_json::to_string_pretty(&record)?))?;
                Ok(Exit::Success)
            }
            Err(RecordError::NotFound) => {
                eprintln!("pi-dispatch: no run record has that id (see pi-dispatch runs)");
                Ok(Exit::CheckFailed)
            }
            Err(e) => Err(e.into()),
        };
    }
    let all = records.list()?;
    if args.json {
        crate::output::print(&format!("{}\n", serde_json::to_string_pretty(&all)?))?;
        return Ok(Exit::Success);
    }
    if all.is_empty() {
        crate::output::print("No runs yet.\n")?;
        return Ok(Exit::Success);
    }
    let mut text = String::new();
    for r in &all {
        let calls: u64 = r.mcp.tool_calls.iter().map(|c| c.calls).sum();
        text.push_str(&format!(
            "{}  {:<9}  {:<26}  attempt {}  {} turns  {} MCP calls  {}\n",
            r.job_id,
            r.outcome.as_str(),
            r.reason.as_deref().unwrap_or("-"),
            r.attempt,
            r.turns.map_or("-".to_owned(), |t| t.to_string()),
            calls,
            r.trigger_type,
        ));
    }
    crate::output::print(&text)?;
    Ok(Exit::Success)
}
