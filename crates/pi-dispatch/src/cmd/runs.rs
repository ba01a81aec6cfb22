//! `pi-dispatch runs [--json] [--limit N] [--outcome O] [--reason R] [--trigger T] [--repo
//! OWNER/NAME | --folder PATH] [--since DURATION]` lists the run records of the deployment, the
//! newest first (50 unless told), as the records' index finds them, and says which records it could
//! not read; `pi-dispatch runs show ID [--json |
//! --transcript [--raw]]` shows one record (why it ended, the detail and the fix, what it used),
//! the record as stored, or the job's transcript. Everything printed from a job's data is inert:
//! control characters are shown as escapes (see `output::print`), but with `--raw`.

use std::fmt::Write as _;

use records::query::{Query, QueryError};
use records::record::Record;
use records::store::{RecordError, Records};

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the records as a JSON array (each record's queued job without its forge event,
    /// unless --with-events).
    #[arg(long)]
    json: bool,
    /// With --json: keep each record's queued forge event (the text and all, up to about
    /// a MiB each; `runs show ID --json` always has it).
    #[arg(long, requires = "json")]
    with_events: bool,
    /// List at most N records, the newest first.
    #[arg(long, value_name = "N", default_value_t = records::query::DEFAULT_LIMIT as u64,
        value_parser = clap::value_parser!(u64).range(1..=records::query::MAX_LIMIT as u64))]
    limit: u64,
    /// Only jobs that ended so: completed, failed, policy or cancelled.
    #[arg(long, value_name = "OUTCOME")]
    outcome: Option<String>,
    /// Only jobs that ended for this reason (a token such as time-limit), or with none.
    #[arg(long, value_name = "REASON")]
    reason: Option<String>,
    /// Only jobs of this trigger: its index in triggers.json, or what started the job (cron, cli,
    /// a forge event's type).
    #[arg(long, value_name = "TRIGGER")]
    trigger: Option<String>,
    /// Only forge jobs on this repository.
    #[arg(long, value_name = "OWNER/NAME", conflicts_with = "folder")]
    repo: Option<String>,
    /// Only local jobs in this folder.
    #[arg(long, value_name = "PATH")]
    folder: Option<String>,
    /// Only jobs that ended within this long: 30m, 12h, 7d, 2w.
    #[arg(long, value_name = "DURATION")]
    since: Option<String>,
    #[command(subcommand)]
    command: Option<RunsCommand>,
}

#[derive(Debug, clap::Subcommand)]
enum RunsCommand {
    /// Show one job: its record, or where it stands while it has not ended.
    Show {
        /// The job's id.
        id: String,
        /// Print the record as stored (JSON).
        #[arg(long, conflicts_with = "transcript")]
        json: bool,
        /// Print the job's transcript: pi's events as the worker kept them (secrets redacted),
        /// every control character in them shown as an escape.
        #[arg(long)]
        transcript: bool,
        /// With --transcript: print it byte for byte, control characters and all (for a file or
        /// a program, not a terminal: the job wrote it).
        #[arg(long, requires = "transcript")]
        raw: bool,
        /// Follow a queued or running job: print its transcript (redacted) as it is written, from
        /// any host, then its record once it has ended.
        #[arg(long, conflicts_with_all = ["json", "transcript"])]
        follow: bool,
    },
}

/// The deployment's records, in the queue's store (the SQLite file, or the queue's Redis every
/// host shares), with the record files of an earlier version brought in on first use.
pub fn records(ctx: &Context) -> anyhow::Result<Records> {
    let settings = ctx.settings()?;
    let password = match settings.queue {
        config::settings::QueueBackend::Sqlite => None,
        config::settings::QueueBackend::Redis { .. } => ctx
            .environment()?
            .get(config::settings::QUEUE_PASSWORD_SETTING),
    };
    Ok(Records::open(&settings, password)?)
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    ctx.deployment()?;
    let records = records(ctx)?;
    if let Some(show) = &args.command {
        return show_one(ctx, &records, show);
    }
    let query = match query(args) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("pi-dispatch: {e}");
            return Ok(Exit::Unusable);
        }
    };
    if args.json {
        return stream_json(&records, &query, args.with_events);
    }
    let page = records.find(&query, None)?;
    say_unreadable(&records, &page.unreadable);
    if page.records.is_empty() {
        let none = if page.unreadable.is_empty() && records.count()? == 0 {
            "No runs yet.\n"
        } else {
            "No run matches.\n"
        };
        crate::output::print(none)?;
        return Ok(Exit::Success);
    }
    crate::output::print(&table(&page.records))?;
    Ok(Exit::Success)
}

/// `runs show`: one job's record (as text, JSON or its transcript), or where it stands while it
/// has not ended; `--follow` follows it to its end.
fn show_one(ctx: &Context, records: &Records, show: &RunsCommand) -> anyhow::Result<Exit> {
    let RunsCommand::Show {
        id,
        json,
        transcript,
        raw,
        follow,
    } = show;
    if *follow {
        return crate::cmd::live::follow(ctx, records, id);
    }
    let record = match records.read(id) {
        Ok(record) => record,
        Err(RecordError::NotFound) => {
            // Not ended: queued or running, when the queue has it.
            if let Some(exit) = crate::cmd::live::show_open(ctx, records, id, *json)? {
                return Ok(exit);
            }
            eprintln!(
                "pi-dispatch: no job has the id {} in {}: it is neither queued, running nor recorded (see pi-dispatch runs and pi-dispatch status)",
                crate::output::display_name(id),
                records.place()
            );
            return Ok(Exit::Unusable);
        }
        Err(e) => return Err(e.into()),
    };
    if *transcript {
        return show_transcript(ctx, &record, *raw);
    }
    let text = if *json {
        format!("{}\n", serde_json::to_string_pretty(&record)?)
    } else {
        let mut text = crate::record_text::human(&record);
        let settings = ctx.settings()?;
        if queue::exists(&settings) {
            for again in ctx.queue(&settings)?.reruns(id)? {
                let _ = writeln!(text, "run again as: {again}");
            }
        }
        text
    };
    crate::output::print(&text)?;
    Ok(Exit::Success)
}

fn say_unreadable(records: &Records, ids: &[String]) {
    for id in ids {
        eprintln!(
            "pi-dispatch: the record {} in {} is not readable as a run record (damaged, or written by another version); it is left out",
            crate::output::display_name(id),
            records.place()
        );
    }
}

/// The records as one JSON array, printed a page at a time as the store gives them: however many
/// are asked for, no more than a page is held, and, unless `with_events`, no record's queued
/// forge event (a record keeps it for `rerun`, up to about a MiB each).
fn stream_json(records: &Records, query: &Query, with_events: bool) -> anyhow::Result<Exit> {
    const PAGE: usize = 1_000;
    let mut left = query.limit;
    let mut after = None;
    let mut first = true;
    crate::output::print("[")?;
    while left > 0 {
        let page_query = Query {
            limit: left.min(PAGE),
            ..query.clone()
        };
        let page = records.find(&page_query, after.as_ref())?;
        say_unreadable(records, &page.unreadable);
        left = left.saturating_sub(page.records.len() + page.unreadable.len());
        let mut text = String::new();
        for r in &page.records {
            let mut r = r.clone();
            if !with_events && let Some(job) = r.job.as_mut() {
                job.event = None;
            }
            let pretty = serde_json::to_string_pretty(&r)?;
            text.push_str(if first { "\n" } else { ",\n" });
            first = false;
            for (i, line) in pretty.lines().enumerate() {
                if i > 0 {
                    text.push('\n');
                }
                text.push_str("  ");
                text.push_str(line);
            }
        }
        crate::output::print(&text)?;
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    crate::output::print(if first { "]\n" } else { "\n]\n" })?;
    Ok(Exit::Success)
}

/// The records as a table under a header: when each ended (UTC), the job, how and why it ended,
/// its attempt, turns and MCP calls, its trigger and what it was for.
fn table(found: &[Record]) -> String {
    let id_width = found
        .iter()
        .map(|r| r.job_id.chars().count())
        .max()
        .unwrap_or(0)
        .max(3);
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{:<19}  {:<id_width$}  {:<9}  {:<26}  {:>7}  {:>5}  {:>9}  {:<8}  FOR",
        "ENDED (UTC)", "JOB", "OUTCOME", "REASON", "ATTEMPT", "TURNS", "MCP CALLS", "TRIGGER"
    );
    for r in found {
        let calls: u64 = r.mcp.tool_calls.iter().map(|c| c.calls).sum();
        let ended = records::record::utc(r.finished_at_ms);
        let _ = writeln!(
            text,
            "{:<19}  {:<id_width$}  {:<9}  {:<26}  {:>7}  {:>5}  {:>9}  {:<8}  {}",
            ended.trim_end_matches(" UTC"),
            r.job_id,
            r.outcome.as_str(),
            r.reason.map_or("-", |r| r.as_str()),
            r.attempt,
            r.turns.map_or("-".to_owned(), |t| t.to_string()),
            calls,
            r.trigger_type,
            purpose(r),
        );
    }
    text
}

/// The records query the options ask for.
fn query(args: &Args) -> Result<Query, QueryError> {
    let since_ms = match &args.since {
        None => None,
        Some(word) => {
            let back = Query::since(word)?;
            let ms = u64::try_from(back.as_millis()).unwrap_or(u64::MAX);
            Some(records::record::now_ms().saturating_sub(ms))
        }
    };
    Ok(Query {
        limit: usize::try_from(args.limit).unwrap_or(records::query::MAX_LIMIT),
        outcome: args.outcome.as_deref().map(Query::outcome).transpose()?,
        reason: args.reason.as_deref().map(Query::reason).transpose()?,
        trigger: args.trigger.as_deref().map(Query::trigger),
        repo: args.repo.as_deref().map(Query::repo).transpose()?,
        folder: args.folder.clone(),
        since_ms,
    })
}

fn show_transcript(ctx: &Context, record: &Record, raw: bool) -> anyhow::Result<Exit> {
    let path = records::transcripts::path(&ctx.dir.join("state/jobs"), &record.job_id);
    if !record.transcript {
        eprintln!(
            "pi-dispatch: job {} has no transcript (it did not start, transcripts are off, or it could not be kept)",
            record.job_id
        );
        return Ok(Exit::CheckFailed);
    }
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let keep = ctx.settings()?.keep.transcripts_days;
            let age_ms = records::record::now_ms().saturating_sub(record.finished_at_ms);
            if age_ms >= keep.saturating_mul(worker::retention::DAY_MS) {
                eprintln!(
                    "pi-dispatch: job {}'s transcript is no longer kept (transcripts are kept {keep} days: PI_KEEP_TRANSCRIPTS_DAYS)",
                    record.job_id
                );
                return Ok(Exit::CheckFailed);
            }
            // With the queue in Redis, the job may have run on another host.
            if let Some(w) = &record.worker {
                eprintln!(
                    "pi-dispatch: job {}'s transcript is kept on the host of the worker that ran it ({w}); run this there",
                    record.job_id
                );
                return Ok(Exit::CheckFailed);
            }
            anyhow::bail!("{} cannot be read ({})", path.display(), e.kind())
        }
        Err(e) => anyhow::bail!("{} cannot be read ({})", path.display(), e.kind()),
    };
    if raw {
        crate::output::print_raw(&bytes)?;
    } else {
        crate::output::print(&String::from_utf8_lossy(&bytes))?;
    }
    Ok(Exit::Success)
}

/// What a job was for, on one line: its issue or folder, and the start of its task.
fn purpose(r: &Record) -> String {
    let place = r.item.as_deref().or(r.folder.as_deref()).unwrap_or("-");
    let task: String = r
        .task
        .as_deref()
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let mut short: String = task.chars().take(60).collect();
    if short.len() < task.len() {
        short.push('…');
    }
    match short.is_empty() {
        true => place.to_owned(),
        false => format!("{place}  {short}"),
    }
}
