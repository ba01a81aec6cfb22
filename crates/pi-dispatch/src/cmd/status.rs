//! `pi-dispatch status [--json]`: the queue: jobs waiting, running (where, on what, for how long),
//! lost, and recently done, and the workers (live, draining or gone). A running job whose lease
//! lapsed is shown as lost: its worker is gone (a job is leased again, or reported lost, at the
//! next look of a live worker). A queued job that no live worker carries the labels for is shown
//! waiting for a host.

use std::time::SystemTime;

use queue::End;
use records::open_jobs::{Shown, place, shown};
use records::workers::WorkerShown;
use serde::Serialize;

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the queue as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    counts: Counts,
    open: Vec<Shown>,
    recently_done: Vec<Done>,
    workers: Vec<WorkerShown>,
}

#[derive(Debug, Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct Counts {
    queued: usize,
    waiting: usize,
    waiting_for_host: usize,
    running: usize,
    lost: usize,
    done: usize,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Done {
    id: String,
    attempt: u32,
    finished_at_ms: u64,
    /// How the queue saw it end: `finished` (see its record), `exhausted`, `lost`, `cancelled`.
    end: &'static str,
}

fn ms(t: SystemTime) -> u64 {
    records::record::unix_ms(t)
}

fn end_word(end: End) -> &'static str {
    match end {
        End::Finished => "finished",
        End::Exhausted => "exhausted",
        End::Lost => "lost",
        End::Cancelled => "cancelled",
    }
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    ctx.deployment()?;
    let settings = ctx.settings()?;
    let now = SystemTime::now();
    let report = if queue::exists(&settings) {
        let queue = ctx.queue(&settings)?;
        let status = queue.status(now, 10)?;
        let workers = records::workers::shown(&queue.workers()?, now, settings.worker_gone_after());
        let mut open: Vec<Shown> = status.open.iter().map(|j| shown(j, now)).collect();
        place(&mut open, &workers);
        let mut counts = Counts {
            done: status.counts.done,
            ..Counts::default()
        };
        for job in &open {
            match job.state {
                "queued" => counts.queued += 1,
                "waiting" => counts.waiting += 1,
                "waiting-for-host" => counts.waiting_for_host += 1,
                "lost" => counts.lost += 1,
                _ => counts.running += 1,
            }
        }
        Report {
            counts,
            open,
            recently_done: status
                .recent_done
                .iter()
                .map(|d| Done {
                    id: d.id.clone(),
                    attempt: d.attempt,
                    finished_at_ms: ms(d.finished_at),
                    end: end_word(d.end),
                })
                .collect(),
            workers,
        }
    } else {
        Report {
            counts: Counts::default(),
            open: Vec::new(),
            recently_done: Vec::new(),
            workers: Vec::new(),
        }
    };
    crate::output::print_report(args.json, &report, || human(&report, now))?;
    Ok(Exit::Success)
}

fn human(report: &Report, now: SystemTime) -> String {
    let c = &report.counts;
    let mut text = format!(
        "{} queued, {} waiting to retry, {} running, {} lost, {} done\n",
        c.queued, c.waiting, c.running, c.lost, c.done
    );
    if c.waiting_for_host > 0 {
        text.push_str(&format!(
            "{} waiting for a host: no live worker carries the labels they need\n",
            c.waiting_for_host
        ));
    }
    let now_ms = ms(now);
    for job in &report.open {
        let state = match (job.state, &job.worker, job.until_ms) {
            ("running", Some(w), _) => {
                format!("running on {w} for {}s", job.running_secs.unwrap_or(0))
            }
            ("cancelling", Some(w), _) => format!("cancelling on {w}"),
            ("lost", Some(w), Some(until)) => format!(
                "lost: {w} stopped renewing its lease {}s ago",
                secs_between_ms(until, now_ms)
            ),
            ("waiting", _, Some(until)) => {
                format!("retry in {}s", secs_between_ms(now_ms, until))
            }
            ("waiting-for-host", ..) => {
                format!("waiting for a host with {}", job.needs.join(", "))
            }
            (other, _, _) => other.to_owned(),
        };
        text.push_str(&format!(
            "  {}  attempt {}  {}  queued {}s ago\n",
            job.id, job.attempt, state, job.waited_secs
        ));
        if let Some(task) = &job.task {
            text.push_str(&format!("      task: {task}\n"));
        }
        if let Some(folder) = &job.folder {
            text.push_str(&format!("      folder: {folder}\n"));
        }
        if let Some(issue) = &job.issue {
            text.push_str(&format!("      about: {issue}\n"));
        }
    }
    if !report.recently_done.is_empty() {
        text.push_str("Recently done (see pi-dispatch runs):\n");
        for job in &report.recently_done {
            text.push_str(&format!(
                "  {}  attempt {}  {}  {}s ago\n",
                job.id,
                job.attempt,
                job.end,
                secs_between_ms(job.finished_at_ms, now_ms)
            ));
        }
    }
    if report.open.is_empty() && report.recently_done.is_empty() && c.done == 0 {
        text = "The queue is empty (no job was ever queued here).\n".to_owned();
    }
    text.push_str(&workers_text(&report.workers));
    text
}

fn workers_text(workers: &[WorkerShown]) -> String {
    if !workers.iter().any(WorkerShown::takes_jobs) && workers.iter().all(|w| w.state == "gone") {
        let mut text =
            "No worker is running: queued jobs wait until one starts (pi-dispatch worker).\n"
                .to_owned();
        for w in workers {
            text.push_str(&worker_line(w));
        }
        return text;
    }
    let mut text = "Workers:\n".to_owned();
    for w in workers {
        text.push_str(&worker_line(w));
    }
    text
}

fn worker_line(w: &WorkerShown) -> String {
    let state = match w.state {
        "gone" => format!("gone: unseen for {}s", w.seen_secs_ago),
        other => format!("{other}, seen {}s ago", w.seen_secs_ago),
    };
    format!(
        "  {}  {state}  {}/{} jobs  labels {}  version {}\n",
        w.card.id,
        w.card.running,
        w.card.concurrency,
        w.card.labels.join(","),
        w.card.version
    )
}

fn secs_between_ms(from: u64, to: u64) -> u64 {
    to.saturating_sub(from) / 1000
}
