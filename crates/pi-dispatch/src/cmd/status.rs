//! `pi-dispatch status [--json]`: the queue: jobs waiting, running (where, on what, for how long),
//! lost, and recently done. A running job whose lease lapsed is shown as lost: its worker is gone
//! (a job is leased again, or reported lost, at the next look of a live worker).

use std::time::{Duration, SystemTime};

use protocol::job::Job;
use queue::{End, OpenJob, OpenState};
use serde::Serialize;

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the queue as JSON.
    #[arg(long)]
    json: bool,
}

/// One job not done, as status shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Shown {
    id: String,
    /// `queued`, `waiting` (to retry), `running`, `lost` (its worker's lease lapsed), or
    /// `cancelling`.
    state: &'static str,
    attempt: u32,
    queued_at_ms: u64,
    /// The worker holding it (`host:pid`), for a running or lost job.
    #[serde(skip_serializing_if = "Option::is_none")]
    worker: Option<String>,
    /// Seconds since it was queued.
    waited_secs: u64,
    /// Seconds it has been running (its current lease), for a running job.
    #[serde(skip_serializing_if = "Option::is_none")]
    running_secs: Option<u64>,
    /// When a waiting job is tried again, or when a running job's lease lapses.
    #[serde(skip_serializing_if = "Option::is_none")]
    until_ms: Option<u64>,
    /// The first line of its task, its repository folder, and its trigger.
    #[serde(skip_serializing_if = "Option::is_none")]
    task: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    folder: Option<String>,
    trigger_type: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    counts: Counts,
    open: Vec<Shown>,
    recently_done: Vec<Done>,
}

#[derive(Debug, Serialize, Default)]
struct Counts {
    queued: usize,
    waiting: usize,
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
    worker::record::unix_ms(t)
}

fn secs_between(from: SystemTime, to: SystemTime) -> u64 {
    to.duration_since(from).unwrap_or(Duration::ZERO).as_secs()
}

/// The first line of a task, at most 80 characters.
fn first_line(task: &str) -> String {
    let line = task.lines().next().unwrap_or_default().trim();
    if line.chars().count() > 80 {
        line.chars().take(79).chain(['…']).collect()
    } else {
        line.to_owned()
    }
}

fn shown(job: &OpenJob, now: SystemTime) -> Shown {
    let queued = serde_json::from_str::<Job>(&job.payload).ok();
    let (state, worker, until) = match &job.state {
        OpenState::Queued => ("queued", None, None),
        OpenState::Waiting { until } => ("waiting", None, Some(ms(*until))),
        OpenState::Leased { worker, until, .. } if *until < now => {
            ("lost", Some(worker.clone()), Some(ms(*until)))
        }
        OpenState::Leased { worker, until, .. } if job.cancel_requested => {
            ("cancelling", Some(worker.clone()), Some(ms(*until)))
        }
        OpenState::Leased { worker, until, .. } => {
            ("running", Some(worker.clone()), Some(ms(*until)))
        }
        OpenState::Lost => ("lost", None, None),
    };
    let running_secs = match &job.state {
        OpenState::Leased { until, since, .. } if *until >= now => Some(secs_between(*since, now)),
        _ => None,
    };
    Shown {
        id: job.id.clone(),
        state,
        attempt: job.attempt,
        queued_at_ms: ms(job.queued_at),
        worker,
        waited_secs: secs_between(job.queued_at, now),
        running_secs,
        until_ms: until,
        task: queued
            .as_ref()
            .and_then(|j| j.task.as_deref())
            .map(first_line),
        folder: queued.as_ref().and_then(|j| j.folder.clone()),
        trigger_type: queued.map(|j| j.trigger_type),
    }
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
    let settings = ctx.settings()?;
    let now = SystemTime::now();
    let report = if queue::exists(&settings) {
        let status = ctx.queue(&settings)?.status(now, 10)?;
        let open: Vec<Shown> = status.open.iter().map(|j| shown(j, now)).collect();
        let mut counts = Counts {
            done: status.counts.done,
            ..Counts::default()
        };
        for job in &open {
            match job.state {
                "queued" => counts.queued += 1,
                "waiting" => counts.waiting += 1,
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
        }
    } else {
        Report {
            counts: Counts::default(),
            open: Vec::new(),
            recently_done: Vec::new(),
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
    text
}

fn secs_between_ms(from: u64, to: u64) -> u64 {
    to.saturating_sub(from) / 1000
}
