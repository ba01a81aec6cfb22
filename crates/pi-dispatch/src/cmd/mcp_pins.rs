//! `pi-dispatch mcp pins`, `mcp pins diff NAME` and `mcp pin NAME`: the servers' pins in the
//! queue's store, what the last job saw differ from one, field by field, and an operator's
//! approval, which connects the server as a job would (in its sandbox, with egress as a job has
//! it) and makes what it lists now its pin.
//!
//! Exit 0 when the command did what it says; 1 when `mcp pins diff` finds drift waiting for
//! approval or `mcp pin` could not list the server; 2 when the command is misused or the store
//! cannot be read.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use protocol::json;
use protocol::pins::{self, DriftKind, FieldChange, StoredDrift, StoredPin};
use serde::Serialize;

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct PinsArgs {
    #[command(subcommand)]
    command: Option<PinsCommand>,
    /// Print the pins as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Subcommand)]
enum PinsCommand {
    /// Show what the last job saw differ from a server's pin, field by field.
    Diff(DiffArgs),
}

#[derive(Debug, clap::Args)]
struct DiffArgs {
    /// The server, as mcp.json names it.
    name: String,
    /// Print the diff as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct PinArgs {
    /// The server, as mcp.json names it.
    name: String,
    /// Connect it as cron trigger N's job would (its image, secrets and egress); the trigger must
    /// name the server.
    #[arg(long, value_name = "N")]
    trigger: Option<usize>,
    /// The folder the listing job works in, as a local job's [default: an empty folder of its
    /// own in the deployment's state].
    #[arg(long, value_name = "DIR", conflicts_with = "trigger")]
    folder: Option<PathBuf>,
}

/// The pins and the drift noted, read from the store: each entry by server, or why it does not
/// read.
struct Stored {
    pins: BTreeMap<String, Result<StoredPin, String>>,
    drifts: BTreeMap<String, Result<StoredDrift, String>>,
}

impl Stored {
    fn read(ctx: &Context) -> anyhow::Result<Stored> {
        let settings = ctx.settings()?;
        let store = ctx.queue(&settings)?;
        Ok(Stored {
            pins: parse_all(store.pins()?),
            drifts: parse_all(store.pin_drifts()?),
        })
    }
}

/// Each store entry read, or why it does not read (never its text).
fn parse_all<T: serde::de::DeserializeOwned>(
    entries: Vec<(String, String)>,
) -> BTreeMap<String, Result<T, String>> {
    entries
        .into_iter()
        .map(|(server, text)| {
            let parsed = serde_json::from_str(&text)
                .map_err(|e| format!("its entry in the store cannot be read (line {})", e.line()));
            (server, parsed)
        })
        .collect()
}

pub fn pins(args: &PinsArgs, ctx: &Context) -> anyhow::Result<Exit> {
    ctx.deployment()?;
    if let Some(PinsCommand::Diff(diff)) = &args.command {
        return self::diff(diff, ctx);
    }
    let stored = Stored::read(ctx)?;
    let overlay = offered(ctx);
    let rows = rows(&stored, &overlay);
    if args.json {
        crate::output::print(&format!("{}\n", serde_json::json!({ "servers": rows })))?;
    } else {
        crate::output::print(&table(&rows))?;
    }
    Ok(Exit::Success)
}

/// The servers the overlay offers (none when it cannot be read: `mcp check` says why).
fn offered(ctx: &Context) -> Vec<String> {
    let Ok(dir) = ctx.overlay_dir(None) else {
        return Vec::new();
    };
    let file = dir.join("mcp.json");
    crate::output::read_and_parse(
        &file,
        config::mcp::MAX_FILE_BYTES,
        config::mcp::parse_overlay,
    )
    .map(|overlay| overlay.servers.iter().map(|s| s.name.clone()).collect())
    .unwrap_or_default()
}

/// One server's line of `mcp pins`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    server: String,
    /// Whether the overlay offers it today.
    offered: bool,
    /// `pinned`, `no pin`, `drift` (waiting for approval) or `unreadable`.
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pinned_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pinned_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    drift_seen_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

fn rows(stored: &Stored, offered: &[String]) -> Vec<Row> {
    let mut names: Vec<&String> = offered.iter().chain(stored.pins.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|server| {
            let mut row = Row {
                server: server.clone(),
                offered: offered.contains(server),
                state: "no pin",
                tools: None,
                pinned_by: None,
                pinned_at: None,
                drift_seen_by: None,
                detail: None,
            };
            match stored.pins.get(server) {
                None => {}
                Some(Err(why)) => (row.state, row.detail) = ("unreadable", Some(why.clone())),
                Some(Ok(pin)) => {
                    row.state = "pinned";
                    row.tools = Some(pin.listing.tools.len());
                    row.pinned_by = Some(pin.by.clone());
                    row.pinned_at = Some(records::record::utc(pin.pinned_at_ms));
                }
            }
            if let Some(drift) = stored.drifts.get(server) {
                row.state = "drift";
                row.drift_seen_by = Some(match drift {
                    Ok(d) => format!("job {}", d.job_id),
                    Err(why) => why.clone(),
                });
            }
            row
        })
        .collect()
}

fn table(rows: &[Row]) -> String {
    if rows.is_empty() {
        return "No server is offered or pinned.\n".to_owned();
    }
    let mut out = String::new();
    for row in rows {
        let _ = write!(out, "{}: {}", row.server, row.state);
        if let (Some(by), Some(at), Some(tools)) = (&row.pinned_by, &row.pinned_at, row.tools) {
            let _ = write!(out, ", {tools} tools, pinned by {by} at {at}");
        }
        if let Some(seen) = &row.drift_seen_by {
            let _ = write!(
                out,
                "; {seen} saw it differ (pi-dispatch mcp pins diff {})",
                row.server
            );
        }
        if let Some(detail) = &row.detail {
            let _ = write!(out, " ({detail})");
        }
        if !row.offered {
            out.push_str(" (no longer offered in mcp.json)");
        }
        out.push('\n');
    }
    out
}

/// One tool's change, as `mcp pins diff` shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolDiff {
    tool: String,
    /// `new`, `changed`, `server-changed` or `gone`.
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pinned: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seen: Option<String>,
    /// Field by field, where both definitions were kept.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    fields: Vec<FieldChange>,
    /// Whether a definition the change needs was not kept (too large, or not strict JSON): the
    /// digests are all there is.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    unknown: bool,
}

/// What differs between a server's pin and what a job saw.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Diff {
    server: String,
    pinned_by: String,
    pinned_at: String,
    seen_by: String,
    seen_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_was: Option<pins::ServerInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_now: Option<pins::ServerInfo>,
    tools: Vec<ToolDiff>,
}

fn diff(args: &DiffArgs, ctx: &Context) -> anyhow::Result<Exit> {
    let stored = Stored::read(ctx)?;
    let name = &args.name;
    let pin = match stored.pins.get(name) {
        None => {
            eprintln!("pi-dispatch: {name} has no pin yet: its first job pins what it lists");
            return Ok(Exit::Success);
        }
        Some(Err(why)) => anyhow::bail!("the pin of {name}: {why}"),
        Some(Ok(pin)) => pin,
    };
    let drift = match stored.drifts.get(name) {
        None => {
            crate::output::print(&format!(
                "{name}: no job has seen it differ from its pin (pinned by {} at {})\n",
                pin.by,
                records::record::utc(pin.pinned_at_ms)
            ))?;
            return Ok(Exit::Success);
        }
        Some(Err(why)) => anyhow::bail!("the drift noted for {name}: {why}"),
        Some(Ok(drift)) => drift,
    };
    let diff = diff_of(name, pin, drift);
    if args.json {
        crate::output::print(&format!("{}\n", serde_json::to_string(&diff)?))?;
    } else {
        crate::output::print(&diff_text(&diff))?;
    }
    Ok(Exit::CheckFailed)
}

/// What differs between `pin` and what `drift`'s job saw, tool by tool in name order.
fn diff_of(server: &str, pin: &StoredPin, drift: &StoredDrift) -> Diff {
    let server_changed = pin.listing.server != drift.listing.server;
    let mut tools: Vec<ToolDiff> = drift
        .comparison
        .drift
        .iter()
        .map(|d| {
            let was = d.pinned.as_ref().map(|_| pin.definitions.get(&d.tool));
            let now = drift.definitions.get(&d.tool);
            let (fields, unknown) = fields_of(d.kind, was, now);
            ToolDiff {
                tool: d.tool.clone(),
                kind: d.kind.as_str(),
                pinned: d.pinned.clone(),
                seen: Some(d.seen.clone()),
                fields,
                unknown,
            }
        })
        .collect();
    tools.extend(drift.comparison.gone.iter().map(|tool| ToolDiff {
        tool: tool.clone(),
        kind: "gone",
        pinned: pin.listing.tools.get(tool).cloned(),
        seen: None,
        fields: Vec::new(),
        unknown: false,
    }));
    tools.sort_by(|a, b| a.tool.cmp(&b.tool));
    Diff {
        server: server.to_owned(),
        pinned_by: pin.by.clone(),
        pinned_at: records::record::utc(pin.pinned_at_ms),
        seen_by: format!("job {}", drift.job_id),
        seen_at: records::record::utc(drift.seen_at_ms),
        server_was: server_changed.then(|| pin.listing.server.clone()),
        server_now: server_changed.then(|| drift.listing.server.clone()),
        tools,
    }
}

/// The fields that changed: `was` is `None` for a new tool, `Some(None)` for a pinned tool whose
/// definition was not kept. Whether a definition needed was missing.
fn fields_of(
    kind: DriftKind,
    was: Option<Option<&String>>,
    now: Option<&String>,
) -> (Vec<FieldChange>, bool) {
    let parse = |text: &String| json::parse(text).ok();
    let now = now.and_then(parse);
    match (kind, was) {
        // Only the server's name or version moved: the tool is the same.
        (DriftKind::ServerChanged, _) => (Vec::new(), false),
        (_, None) => match now {
            Some(now) => {
                let whole = FieldChange {
                    path: String::new(),
                    was: None,
                    now: Some(pins::canonical(&now)),
                };
                (vec![whole], false)
            }
            None => (Vec::new(), true),
        },
        (_, Some(was)) => match (was.and_then(parse), now) {
            (Some(was), Some(now)) => (pins::field_changes(&was, &now), false),
            _ => (Vec::new(), true),
        },
    }
}

fn short(digest: &str) -> &str {
    digest.get(..19).unwrap_or(digest)
}

fn info(i: &pins::ServerInfo) -> String {
    format!(
        "{} {}",
        i.name.as_deref().unwrap_or("(no name)"),
        i.version.as_deref().unwrap_or("(no version)")
    )
}

/// The diff as `mcp pins diff` prints it.
fn diff_text(d: &Diff) -> String {
    let mut out = format!(
        "{}: pinned by {} at {}; {} saw it differ at {}\n",
        d.server, d.pinned_by, d.pinned_at, d.seen_by, d.seen_at
    );
    if let (Some(was), Some(now)) = (&d.server_was, &d.server_now) {
        let _ = writeln!(out, "  server: {} -> {}", info(was), info(now));
    }
    for t in &d.tools {
        let digests = match (&t.pinned, &t.seen) {
            (Some(p), Some(s)) => format!("{} -> {}", short(p), short(s)),
            (None, Some(s)) => short(s).to_owned(),
            (Some(p), None) => short(p).to_owned(),
            (None, None) => String::new(),
        };
        let _ = writeln!(out, "  {} {} ({digests})", t.kind, t.tool);
        for f in &t.fields {
            let path = if f.path.is_empty() { "/" } else { &f.path };
            let side = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".to_owned());
            let _ = writeln!(out, "    {path}: {} -> {}", side(&f.was), side(&f.now));
        }
        if t.unknown {
            out.push_str("    (a definition was not kept: only the digests differ)\n");
        }
    }
    let _ = writeln!(
        out,
        "To approve what it lists now: pi-dispatch mcp pin {}",
        d.server
    );
    out
}

pub fn pin(args: &PinArgs, ctx: &Context) -> anyhow::Result<Exit> {
    ctx.deployment()?;
    // The listing job's worker holds the job's secrets, as a worker does.
    crate::cmd::job::no_core_files()?;
    let name = &args.name;
    let before = Stored::read(ctx)?;
    let job = listing_job(args, ctx)?;
    let record = approve(ctx, &job, operator())?;
    if record.outcome != records::record::Outcome::Completed {
        eprint!("{}", not_listed(name, &record));
        return Ok(Exit::CheckFailed);
    }
    let after = Stored::read(ctx)?;
    let Some(Ok(pin)) = after.pins.get(name) else {
        anyhow::bail!(
            "{name} was listed, but its pin could not be stored: the worker's log says why"
        );
    };
    let was = before.pins.get(name).and_then(|p| p.as_ref().ok());
    crate::output::print(&approval_text(name, was, pin, &job.id))?;
    Ok(Exit::Success)
}

/// Who approves: the operator's login name (the one `sudo` was run by, when it was) and uid.
fn operator() -> String {
    let uid = rustix::process::getuid().as_raw();
    let name = ["SUDO_USER", "USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|n| !n.is_empty()));
    match name {
        Some(name) => format!("{name} (uid {uid}) with mcp pin"),
        None => format!("uid {uid} with mcp pin"),
    }
}

/// The job that lists the server: cron trigger N's job with only this server, or a local job in
/// the folder given (or one of its own), whose task is never sent: the runner only lists.
fn listing_job(args: &PinArgs, ctx: &Context) -> anyhow::Result<protocol::job::Job> {
    use protocol::job::{Job, McpField};
    let name = &args.name;
    let only = Some(McpField::names([name.as_str()]));
    if let Some(index) = args.trigger {
        let job = crate::cmd::run::trigger_job(ctx, index)?;
        let names = job
            .mcp
            .as_ref()
            .and_then(McpField::as_names)
            .unwrap_or_default();
        if !names.iter().any(|n| n == name) {
            anyhow::bail!("--trigger: trigger {index} does not name the server {name} in run.mcp");
        }
        return Ok(Job { mcp: only, ..job });
    }
    let settings = ctx.settings()?;
    let folder = match &args.folder {
        Some(folder) => ctx.absolute(folder),
        None => own_folder(&ctx.dir.join("state"))?,
    };
    let folder = folder
        .canonicalize()
        .map_err(|e| anyhow::anyhow!("--folder cannot be used ({})", e.kind()))?;
    let Some(folder) = folder.to_str().map(str::to_owned) else {
        anyhow::bail!("--folder must be a UTF-8 path");
    };
    Ok(Job {
        mcp: only,
        provider: settings.provider.clone(),
        model: settings.model.clone(),
        folder: Some(folder),
        task: Some(format!("List the tools of {name} (mcp pin).")),
        ..Job::new(crate::cmd::run::new_job_id("pin")?, "cli", "local")
    })
}

/// The empty folder a listing job works in when none is given: `state/pin-folder`, the job's
/// user's under a root worker (a job never runs as root).
fn own_folder(state: &std::path::Path) -> anyhow::Result<PathBuf> {
    let folder = state.join("pin-folder");
    std::fs::create_dir_all(&folder)
        .map_err(|e| anyhow::anyhow!("state/pin-folder cannot be made ({})", e.kind()))?;
    if rustix::process::geteuid().is_root() {
        let nobody = Some(rustix::fs::Uid::from_raw(sandbox::bwrap::NOBODY));
        let group = Some(rustix::fs::Gid::from_raw(sandbox::bwrap::NOBODY));
        rustix::fs::chown(&folder, nobody, group)?;
    }
    Ok(folder)
}

/// Runs `job` on a worker of this host that only lists and approves what was listed as `who`;
/// the job's record.
fn approve(
    ctx: &Context,
    job: &protocol::job::Job,
    who: String,
) -> anyhow::Result<records::record::Record> {
    use crate::cmd::worker::{How, backend, job_worker, open_state, start_proxy};
    let settings = ctx.settings()?;
    let state = ctx.dir.join("state");
    let how = How {
        time_limit: std::time::Duration::from_secs(settings.time_limit_secs),
        backend: backend(std::path::Path::new(sandbox::bwrap::BWRAP), &settings)?,
        runner_stderr: false,
    };
    let mut worker = job_worker(ctx, settings, &state, how)?;
    worker.approving = Some(who);
    open_state(&state)?;
    let proxy = if worker.settings.egress {
        Some(start_proxy(ctx, worker.egress_control.clone())?)
    } else {
        None
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (_stop, stop) = tokio::sync::watch::channel(None);
    let draft = records::record::Draft::new(job, 1);
    let verdict = runtime.block_on(worker.process(job, draft, stop));
    if let Some(spares) = &worker.disks {
        spares.close();
    }
    if let Some(proxy) = proxy {
        proxy.stop();
    }
    match verdict {
        worker::verdict::Verdict::Ended(ended) => Ok(ended.record),
        worker::verdict::Verdict::HandBack => anyhow::bail!("the listing job was stopped"),
    }
}

/// Why the server was not listed, as its record says.
fn not_listed(name: &str, record: &records::record::Record) -> String {
    let reason = record
        .reason
        .map_or_else(|| record.outcome.as_str().to_owned(), |r| r.to_string());
    let mut text = format!(
        "pi-dispatch: {name} could not be listed, so its pin is unchanged: {reason}
"
    );
    if let Some(detail) = &record.detail {
        let _ = writeln!(text, "  why: {}", detail.why);
    }
    text
}

/// What `mcp pin` says it approved: the first pin, or what differs from the pin it replaced.
fn approval_text(name: &str, was: Option<&StoredPin>, now: &StoredPin, job_id: &str) -> String {
    let mut out = format!(
        "{name}: pinned by {} at {}, {} tools\n",
        now.by,
        records::record::utc(now.pinned_at_ms),
        now.listing.tools.len()
    );
    let Some(was) = was else {
        out.push_str("It had no pin before.\n");
        return out;
    };
    let seen = StoredDrift {
        job_id: job_id.to_owned(),
        seen_at_ms: now.pinned_at_ms,
        listing: now.listing.clone(),
        comparison: pins::compare(Some(&was.listing), &now.listing),
        definitions: now.definitions.clone(),
    };
    if !seen.comparison.drifted() && was.listing.server == now.listing.server {
        out.push_str("It lists what its pin had.\n");
        return out;
    }
    let mut diff = diff_text(&diff_of(name, was, &seen));
    // The approval is made: the last line's advice is not.
    if let Some(end) = diff.trim_end().rfind('\n') {
        diff.truncate(end + 1);
    }
    out.push_str("It replaced this pin:\n");
    out.push_str(&diff);
    out
}

#[cfg(test)]
#[path = "mcp_pins_tests.rs"]
mod tests;
