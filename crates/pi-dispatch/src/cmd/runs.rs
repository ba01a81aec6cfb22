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
    /// With --json: keep each record's queued forge event (the issue's text and all, up to about
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
    if let Some(RunsCommand::Show {
        id,
        json,
        transcript,
        raw,
        follow,
    }) = &args.command
    {
        if *follow {
            return crate::cmd::live::follow(ctx, &records, id);
        }
        let record = match records.read(id) {
            Ok(record) => record,
            Err(RecordError::NotFound) => {
                // Not ended: queued or running, when the queue has it.
                if let Some(exit) = crate::cmd::live::show_open(ctx, &records, id, *json)? {
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
            let mut text = human(&record);
            let settings = ctx.settings()?;
            if queue::exists(&settings) {
                for again in ctx.queue(&settings)?.reruns(id)? {
                    let _ = writeln!(text, "run again as: {again}");
                }
            }
            text
        };
        crate::output::print(&text)?;
        return Ok(Exit::Success);
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

/// A record for a person: how it ended and why, then what it used.
pub(crate) fn human(r: &Record) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "job {}  {}", r.job_id, r.outcome);
    if let Some(of) = &r.rerun_of {
        let _ = writeln!(out, "runs again: {of}");
    }
    match (&r.item, &r.url) {
        (Some(item), Some(url)) => {
            let _ = writeln!(out, "for: {item} ({url})");
        }
        (Some(item), None) => {
            let _ = writeln!(out, "for: {item}");
        }
        _ => {}
    }
    if let Some(folder) = &r.folder {
        let _ = writeln!(out, "folder: {folder}");
    }
    if let Some(task) = &r.task {
        let _ = writeln!(
            out,
            "task: {}",
            task.lines().collect::<Vec<_>>().join("\n      ")
        );
    }
    if let Some(reason) = r.reason {
        let _ = writeln!(out, "reason: {reason}: {}", reason.sentence());
    }
    if let Some(d) = &r.detail {
        let _ = writeln!(out, "why: {}", d.why);
        let names = d.concerns();
        if !names.is_empty() {
            let _ = writeln!(out, "concerns: {}", names.join("; "));
        }
    }
    if let Some(fix) = &r.fix {
        let _ = writeln!(out, "fix: {fix}");
    }
    let _ = writeln!(
        out,
        "trigger: {} (index {}), kind {}, attempt {}",
        r.trigger_type,
        r.trigger_index.map_or("-".to_owned(), |i| i.to_string()),
        r.kind,
        r.attempt
    );
    let _ = writeln!(
        out,
        "model: {}/{}  turns {}  tokens {}  cost {}  spent {}  budget reserved {}",
        r.provider.as_deref().unwrap_or("-"),
        r.model.as_deref().unwrap_or("-"),
        r.turns.map_or("-".to_owned(), |t| t.to_string()),
        r.tokens.as_ref().map_or("-".to_owned(), |t| format!(
            "{} in, {} out",
            t.input, t.output
        )),
        r.cost_usd.map_or("-".to_owned(), |c| format!("${c:.4}")),
        if r.spent { "yes" } else { "no" },
        if r.budget_reserved { "yes" } else { "no" },
    );
    if let Some(job) = &r.attempt_of {
        let _ = writeln!(
            out,
            "an earlier attempt of job {job}, which was run again (pi-dispatch runs show {job})"
        );
    }
    for e in &r.earlier_attempts {
        let _ = writeln!(
            out,
            "earlier attempt {}: {}{}, tokens {}, cost {} (pi-dispatch runs show {})",
            e.attempt,
            e.outcome,
            e.reason.map_or(String::new(), |r| format!(" {r}")),
            e.tokens.as_ref().map_or("-".to_owned(), |t| format!(
                "{} in, {} out",
                t.input, t.output
            )),
            e.cost_usd.map_or("-".to_owned(), |c| format!("${c:.4}")),
            e.record
        );
    }
    if !r.earlier_attempts.is_empty() {
        let _ = writeln!(
            out,
            "the turns, tokens and cost above are the whole run's, every attempt's"
        );
    }
    if let (Some(q), Some(s)) = (r.queued_at_ms, r.started_at_ms) {
        let _ = writeln!(
            out,
            "times: waited {} ms, ran {} ms",
            s.saturating_sub(q),
            r.finished_at_ms.saturating_sub(s)
        );
    }
    servers_text(&mut out, &r.mcp.servers);
    for c in &r.mcp.tool_calls {
        let _ = writeln!(
            out,
            "tool {}/{}: {} calls ({} ok, {} errors, {} refused), {} ms, {} bytes",
            c.server, c.tool, c.calls, c.ok, c.error, c.refused, c.total_ms, c.result_bytes
        );
    }
    if !r.egress_denied.is_empty() {
        out.push_str(&denied(&r.egress_denied));
    }
    if let Some(m) = &r.final_message {
        let _ = writeln!(out, "final message:");
        for line in m.lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    if r.transcript {
        let _ = writeln!(
            out,
            "transcript: pi-dispatch runs show {} --transcript",
            r.job_id
        );
    }
    out
}

/// Each server's state, a line each.
pub(crate) fn servers_text(out: &mut String, servers: &[protocol::exit_line::ServerState]) {
    for s in servers {
        let _ = writeln!(
            out,
            "server {}: {}{}",
            s.name,
            s.state,
            s.ready_ms
                .map_or(String::new(), |m| format!(", ready in {m} ms"))
        );
    }
}

/// Whether `host` is a plain host name a line could admit: letters, digits and hyphens in dotted
/// labels, neither an address nor a name for this machine. A job chose every host it asked for,
/// so only such a name is offered as a line to add.
fn plain_host(host: &str) -> bool {
    let labels: Vec<&str> = host.split('.').collect();
    let is_label = |l: &&str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let lower = host.to_ascii_lowercase();
    host.len() <= 253
        && labels.len() >= 2
        && labels.iter().all(is_label)
        && host.parse::<std::net::IpAddr>().is_err()
        && !labels
            .last()
            .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
        && lower != "localhost"
        && !lower.ends_with(".localhost")
        && !lower.ends_with(".local")
}

/// What the egress proxy refused the job, and the lines that would let each through (or why
/// none would). Every host is the job's choice: a line is offered only for a plain host name.
fn denied(list: &[records::record::EgressDenial]) -> String {
    let mut out = String::from("egress denied (host:port, attempts, the proxy's reason):\n");
    for d in list.iter().filter(|d| d.reason != egress::LEFT_OUT) {
        let _ = writeln!(out, "  {}:{}  {}x  {}", d.host, d.port, d.count, d.reason);
    }
    if let Some(more) = list.iter().find(|d| d.reason == egress::LEFT_OUT) {
        let _ = writeln!(
            out,
            "  and {}x to hosts left out (the record keeps the first 256 hosts a job asked for)",
            more.count
        );
    }
    let mut allow: Vec<&str> = Vec::new();
    let mut declare: Vec<String> = Vec::new();
    let mut none: Vec<String> = Vec::new();
    for d in list.iter().filter(|d| d.reason != egress::LEFT_OUT) {
        let at = format!("{}:{}", d.host, d.port);
        let plain = plain_host(&d.host);
        match (d.reason.as_str(), d.port) {
            ("not-allowed" | "loopback", _) if !plain => none.push(format!(
                "{at}: an address or a name of this machine, which the job chose: no line is offered for it"
            )),
            ("not-allowed", 443) => {
                if !allow.contains(&d.host.as_str()) {
                    allow.push(&d.host);
                }
            }
            ("not-allowed" | "loopback", port) => declare.push(format!(
                "{{\"id\": \"...\", \"host\": \"{}\", \"port\": {port}}}",
                d.host
            )),
            ("plain-http-443", _) => none.push(format!("{at}: plain http to port 443; use https")),
            ("special-address" | "own-machine", _) => none.push(format!(
                "{at}: the name resolves to this machine or to an address no job reaches"
            )),
            ("unresolved", _) => none.push(format!("{at}: the name did not resolve at the proxy")),
            _ => none.push(format!("{at}: the proxy could not read its files then")),
        }
    }
    if !allow.is_empty() {
        out.push_str("the job asked for these hosts; if the job needs them (its choice, not yours: check each), add to egress-allowlist.conf (https on port 443):\n");
        for h in allow {
            let _ = writeln!(out, "  {h}");
        }
    }
    if !declare.is_empty() {
        out.push_str(
            "the job asked for these; if it needs them (its choice: check each), declare in model-endpoints.json (only a declared endpoint opens a port other than 443, or one on this machine):\n",
        );
        for e in declare {
            let _ = writeln!(out, "  {e}");
        }
    }
    if !none.is_empty() {
        out.push_str("no line lets these through:\n");
        for n in none {
            let _ = writeln!(out, "  {n}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use records::record::EgressDenial;

    fn d(host: &str, port: u16, reason: &str, count: u64) -> EgressDenial {
        EgressDenial {
            host: host.into(),
            port,
            reason: reason.into(),
            count,
        }
    }

    #[test]
    fn denials_become_the_lines_that_would_admit_them() {
        let text = super::denied(&[
            d("unlisted.example", 443, "not-allowed", 3),
            d("[2001:db8::1]", 443, "not-allowed", 1),
            d("api.example.com", 8443, "not-allowed", 1),
            d("127.0.0.1", 9, "loopback", 2),
            d("rebind.example", 443, "special-address", 1),
            d("plain.example", 443, "plain-http-443", 1),
        ]);
        assert!(
            text.contains("  unlisted.example:443  3x  not-allowed\n"),
            "{text}"
        );
        let allow = text
            .split("add to egress-allowlist.conf (https on port 443):\n")
            .nth(1)
            .unwrap()
            .split("the job asked for these; if it needs them")
            .next()
            .unwrap();
        // A plain host name is offered, marked as the job's choice; an address never is.
        assert_eq!(allow, "  unlisted.example\n", "{text}");
        assert!(text.contains("its choice"), "{text}");
        assert!(
            text.contains(r#"{"id": "...", "host": "api.example.com", "port": 8443}"#),
            "{text}"
        );
        assert!(!text.contains(r#""host": "127.0.0.1""#), "{text}");
        for address in ["[2001:db8::1]:443", "127.0.0.1:9"] {
            assert!(
                text.contains(&format!(
                    "  {address}: an address or a name of this machine"
                )),
                "{text}"
            );
        }
        assert!(
            text.contains("  rebind.example:443: the name resolves to this machine"),
            "{text}"
        );
        assert!(
            text.contains("  plain.example:443: plain http to port 443; use https"),
            "{text}"
        );
        // A port other than 443 is never offered as an allowlist line.
        assert!(!allow.contains("api.example.com"), "{text}");
    }

    #[test]
    fn only_plain_host_names_are_offered_and_what_was_left_out_is_said() {
        for plain in ["api.example.com", "a-b.example.org"] {
            assert!(super::plain_host(plain), "{plain}");
        }
        for not in [
            "localhost",
            "db.localhost",
            "printer.local",
            "10.0.0.1",
            "[::1]",
            "127.1",
            "example",
            "-x.example",
            "a_b.example",
        ] {
            assert!(!super::plain_host(not), "{not}");
        }
        let text = super::denied(&[
            d("made-up-1.example", 443, "not-allowed", 1),
            d("*", 0, egress::LEFT_OUT, 44),
        ]);
        assert!(text.contains("and 44x to hosts left out"), "{text}");
        assert!(!text.contains("*:0"), "{text}");
    }
}
