//! `pi-dispatch cancel ID`: a job not running is removed from the queue and recorded as
//! cancelled at once; a running one is marked, and the worker running it (on this host or any
//! other sharing the queue) stops it with its whole process tree and records it. `cancel` waits a
//! few seconds for that record.

use std::time::{Duration, Instant, SystemTime};

use queue::Cancel;

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The job's id (as `pi-dispatch status` shows it).
    id: String,
    /// Seconds to wait for a running job's record.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    wait: u64,
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    ctx.deployment()?;
    let settings = ctx.settings()?;
    let id = crate::output::display_name(&args.id);
    if !queue::exists(&settings) {
        eprintln!("pi-dispatch: no job has the id {id} (no job was ever queued here)");
        return Ok(Exit::Unusable);
    }
    let queue = ctx.queue(&settings)?;
    let records = crate::cmd::runs::records(ctx)?;
    match records::store::cancel(&*queue, &records, &args.id, SystemTime::now())? {
        Cancel::Unknown => {
            eprintln!("pi-dispatch: no job has the id {id} (see pi-dispatch status)");
            Ok(Exit::Unusable)
        }
        Cancel::AlreadyDone => {
            eprintln!(
                "pi-dispatch: job {id} is done already; pi-dispatch runs show {id} has its record"
            );
            Ok(Exit::CheckFailed)
        }
        Cancel::Removed { .. } => {
            crate::output::print(&format!(
                "Cancelled {id}: it had not started; nothing was spent.\n"
            ))?;
            Ok(Exit::Success)
        }
        Cancel::Stopping { worker } => {
            let deadline = Instant::now() + Duration::from_secs(args.wait);
            while Instant::now() < deadline {
                if let Ok(record) = records.read(&args.id) {
                    crate::output::print(&format!(
                        "Cancelled {id}: worker {worker} stopped it ({}).\n",
                        record.outcome
                    ))?;
                    return Ok(Exit::Success);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            crate::output::print(&format!(
                "Cancelling {id}: worker {worker} is told to stop it; its record follows (pi-dispatch runs show {id}).\n"
            ))?;
            Ok(Exit::Success)
        }
    }
}
