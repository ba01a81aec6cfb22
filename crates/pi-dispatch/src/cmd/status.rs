//! `pi-dispatch status`: the queue: jobs waiting, running and recently done.

use std::time::SystemTime;

use worker::queue::{OpenState, Queue as _};

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {}

fn ago(t: SystemTime, now: SystemTime) -> String {
    match now.duration_since(t) {
        Ok(d) => format!("{}s ago", d.as_secs()),
        Err(e) => format!("in {}s", e.duration().as_secs()),
    }
}

pub fn run(_args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    let path = crate::cmd::run::queue_path(&ctx.dir);
    if !path.exists() {
        crate::output::print("The queue is empty (no job was ever queued here).\n")?;
        return Ok(Exit::Success);
    }
    let queue = worker::queue::SqliteQueue::open(&path)?;
    let now = SystemTime::now();
    let status = queue.status(now, 10)?;
    let c = status.counts;
    let mut text = format!(
        "{} queued, {} waiting to retry, {} running, {} lost, {} done\n",
        c.queued, c.waiting, c.leased, c.lost, c.done
    );
    for job in &status.open {
        let state = match &job.state {
            OpenState::Queued => "queued".to_owned(),
            OpenState::Waiting { until } => format!("retry {}", ago(*until, now)),
            OpenState::Leased { worker, until } => {
                format!("running on {worker} (lease ends {})", ago(*until, now))
            }
            OpenState::Lost => "lost".to_owned(),
        };
        text.push_str(&format!(
            "  {}  attempt {}  {}  queued {}\n",
            job.id,
            job.attempt,
            state,
            ago(job.queued_at, now)
        ));
    }
    if !status.recent_done.is_empty() {
        text.push_str("Recently done (see pi-dispatch runs):\n");
        for job in &status.recent_done {
            text.push_str(&format!(
                "  {}  attempt {}  {:?}  {}\n",
                job.id,
                job.attempt,
                job.end,
                ago(job.finished_at, now)
            ));
        }
    }
    crate::output::print(&text)?;
    Ok(Exit::Success)
}
