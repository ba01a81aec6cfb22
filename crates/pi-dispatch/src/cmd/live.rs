//! A job that has not ended: `runs show ID` for a queued or running job (where it stands, what it
//! shows live), and `runs show ID --follow` (its redacted transcript as it is written, then its
//! record), on any host that shares the queue. The live view is the job's worker's, written into
//! the queue's store as the job runs ([`records::live`]).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use records::live::Snapshot;
use records::open_jobs::Shown;
use records::store::{RecordError, Records};
use serde::Serialize;

use crate::context::Context;
use crate::exit::Exit;

/// How often `--follow` looks again.
const FOLLOW_EVERY: Duration = Duration::from_millis(300);

/// Lines read at a time.
const PAGE: usize = 500;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OpenReport<'a> {
    open: &'a Shown,
    #[serde(skip_serializing_if = "Option::is_none")]
    live: Option<&'a Snapshot>,
    /// Transcript lines the live view holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    live_lines: Option<u64>,
}

/// What a running job shows live, and how many transcript lines the view holds.
type Shows = Option<(Snapshot, u64)>;

/// The job `id` as it stands in the queue, with what it shows live: `None` when the queue does
/// not have it open (and no record came meanwhile).
fn open_job(ctx: &Context, id: &str) -> anyhow::Result<Option<(Shown, Shows)>> {
    let settings = ctx.settings()?;
    if !queue::exists(&settings) {
        return Ok(None);
    }
    let queue = ctx.queue(&settings)?;
    let now = SystemTime::now();
    let status = queue.status(now, 0)?;
    let Some(job) = status.open.iter().find(|j| j.id == id) else {
        return Ok(None);
    };
    let workers = records::workers::shown(&queue.workers()?, now, settings.worker_gone_after());
    let mut shown = vec![records::open_jobs::shown(job, now)];
    records::open_jobs::place(&mut shown, &workers);
    let live = records::live::read(&*queue, id, 0, 0)?.map(|(s, _, total)| (s, total));
    Ok(shown.pop().map(|s| (s, live)))
}

/// `runs show ID` for a job without a record: `None` when no job has that id.
pub fn show_open(
    ctx: &Context,
    records: &Records,
    id: &str,
    json: bool,
) -> anyhow::Result<Option<Exit>> {
    let Some((shown, live)) = open_job(ctx, id)? else {
        // It may have ended between the two looks.
        return match records.read(id) {
            Ok(record) => {
                crate::output::print(&crate::record_text::human(&record))?;
                Ok(Some(Exit::Success))
            }
            Err(RecordError::NotFound) => Ok(None),
            Err(e) => Err(e.into()),
        };
    };
    if json {
        let report = OpenReport {
            open: &shown,
            live: live.as_ref().map(|(s, _)| s),
            live_lines: live.as_ref().map(|(_, n)| *n),
        };
        crate::output::print(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else {
        crate::output::print(&human_open(&shown, live.as_ref()))?;
    }
    Ok(Some(Exit::Success))
}

/// Where an open job stands, in words.
fn state_words(job: &Shown) -> String {
    let worker = job.worker.as_deref().unwrap_or("?");
    match job.state {
        "running" => format!(
            "running on {worker} for {}s (attempt {})",
            job.running_secs.unwrap_or(0),
            job.attempt
        ),
        "cancelling" => format!("being cancelled on {worker}"),
        "waiting" => "waiting to be retried after a fault".to_owned(),
        "waiting-for-host" => format!(
            "queued {}s ago, waiting for a host with {}: no live worker carries those labels",
            job.waited_secs,
            job.needs.join(", ")
        ),
        "lost" => {
            format!("lost: {worker} stopped renewing its lease; it is run again or recorded lost")
        }
        _ => format!("queued {}s ago, waiting for a worker", job.waited_secs),
    }
}

fn human_open(job: &Shown, live: Option<&(Snapshot, u64)>) -> String {
    let mut out = format!("{}: {}\n", job.id, state_words(job));
    if let Some(task) = &job.task {
        let _ = writeln!(out, "task: {task}");
    }
    if let Some(place) = job.issue.as_deref().or(job.folder.as_deref()) {
        let _ = writeln!(out, "for: {place}");
    }
    if let Some(t) = &job.trigger_type {
        let _ = writeln!(out, "trigger: {t}");
    }
    if !job.needs.is_empty() {
        let _ = writeln!(out, "needs: {}", job.needs.join(", "));
    }
    if let Some(of) = &job.rerun_of {
        let _ = writeln!(out, "runs again: {of}");
    }
    let Some((s, lines)) = live else {
        return out;
    };
    let _ = writeln!(out, "phase: {}", s.phase());
    if s.servers.is_empty() {
        if s.record.sandbox_up_at_ms.is_some() {
            let _ = writeln!(
                out,
                "servers: none said yet (connecting, or the job names none)"
            );
        }
    } else {
        crate::record_text::servers_text(&mut out, &s.servers);
    }
    let by_tool: Vec<String> = s
        .tools_begun()
        .iter()
        .map(|(t, n)| format!("{t} {n}"))
        .collect();
    let _ = writeln!(
        out,
        "so far (as pi says): {} turns, {} tool calls{}",
        s.turns,
        s.tool_calls,
        if by_tool.is_empty() {
            String::new()
        } else {
            format!(" ({})", by_tool.join(", "))
        }
    );
    let _ = writeln!(
        out,
        "transcript so far: {lines} lines{}; follow it: pi-dispatch runs show {} --follow",
        if s.cut {
            " (the live view keeps no more)"
        } else {
            ""
        },
        job.id
    );
    out
}

/// Prints the live view's lines from `next`; the next line to read.
fn print_lines(queue: &dyn queue::Queue, id: &str, mut next: u64) -> anyhow::Result<u64> {
    loop {
        let Some((_, lines, _)) = records::live::read(queue, id, next, PAGE)? else {
            return Ok(next);
        };
        if lines.is_empty() {
            return Ok(next);
        }
        let mut text = String::new();
        for line in &lines {
            text.push_str(line);
            text.push('\n');
        }
        crate::output::print(&text)?;
        next += lines.len() as u64;
    }
}

/// `runs show ID --follow`: the job's transcript lines (redacted) as its worker writes them, then
/// its record. Where it stands goes to standard error when it changes.
pub fn follow(ctx: &Context, records: &Records, id: &str) -> anyhow::Result<Exit> {
    let settings = ctx.settings()?;
    let queue = ctx.queue(&settings)?;
    let mut next = 0;
    let mut said = String::new();
    let mut unseen = 0;
    loop {
        next = print_lines(&*queue, id, next)?;
        match records.read(id) {
            Ok(record) => {
                print_lines(&*queue, id, next)?;
                eprintln!(
                    "pi-dispatch: {id} ended: {}",
                    record
                        .reason
                        .map_or(record.outcome.as_str(), |r| r.as_str())
                );
                crate::output::print(&crate::record_text::human(&record))?;
                return Ok(Exit::Success);
            }
            Err(RecordError::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
        match open_job(ctx, id)? {
            Some((job, _)) => {
                unseen = 0;
                let words = state_words(&job);
                // The running seconds change every look: say the state when its kind changes.
                if job.state != said {
                    eprintln!("pi-dispatch: {id}: {words}");
                    said = job.state.to_owned();
                }
            }
            // A job whose record is written leaves the queue after it: look again a few times
            // before saying there is no such job.
            None => {
                unseen += 1;
                if unseen > 3 {
                    eprintln!(
                        "pi-dispatch: no job has the id {} in {}: it is neither queued, running nor recorded",
                        crate::output::display_name(id),
                        records.place()
                    );
                    return Ok(Exit::Unusable);
                }
            }
        }
        std::thread::sleep(FOLLOW_EVERY);
    }
}
