//! `pi-dispatch import-pi [--from DIR] [--to DIR] [--no-mcp]`: stages the host's pi setup into the
//! overlay, printing every server staged and every one left behind with its reason.

use std::fmt::Write as _;
use std::path::PathBuf;

use config::import::{LeftReason, McpImport};
use setup::import::{
    self, ImportError, MCP_FILE, MODELS_FILE, McpOutcome, Options, PartOutcome, Report,
};

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The host's pi folder [default: PI_CODING_AGENT_DIR, else ~/.pi/agent]
    #[arg(long, value_name = "DIR")]
    from: Option<PathBuf>,
    /// The overlay folder [default: PI_GLOBAL_PI_DIR, else ./pi-global]
    #[arg(long, value_name = "DIR")]
    to: Option<PathBuf>,
    /// Stage no MCP server: the overlay ends with no mcp.json.
    #[arg(long)]
    no_mcp: bool,
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    let from = match &args.from {
        Some(dir) => ctx.absolute(dir),
        None => match ctx.env("PI_CODING_AGENT_DIR") {
            Some(dir) => ctx.absolute(&PathBuf::from(dir)),
            None => {
                let home = ctx
                    .env("HOME")
                    .ok_or_else(|| anyhow::anyhow!("HOME is not set; give --from"))?;
                PathBuf::from(home).join(".pi/agent")
            }
        },
    };
    let to = ctx.overlay_dir(args.to.as_deref())?;
    let opts = Options {
        from,
        to,
        no_mcp: args.no_mcp,
    };
    match import::import(&opts) {
        Ok(report) => {
            crate::output::print(&human(&report))?;
            Ok(Exit::Success)
        }
        Err(e) => {
            crate::output::print(&refusal(&opts, &e))?;
            Ok(if e.is_refusal() {
                Exit::CheckFailed
            } else {
                Exit::Unusable
            })
        }
    }
}

fn refusal(opts: &Options, e: &ImportError) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "import-pi: from {} into {}",
        opts.from.display(),
        opts.to.display()
    );
    let _ = writeln!(out, "✗ {e}");
    if e.changed_nothing() {
        let _ = writeln!(
            out,
            "Nothing was changed: the overlay (its mcp.json included) is exactly as it was."
        );
    }
    out
}

fn human(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "import-pi: from {} into {}",
        report.from.display(),
        report.to.display()
    );
    mcp_lines(&mut out, &report.mcp);
    dropped_line(&mut out, MCP_FILE, "servers", &report.dropped.servers);
    unread_line(&mut out, MCP_FILE, &report.dropped.unread);
    models_line(&mut out, &report.models);
    dropped_line(
        &mut out,
        MODELS_FILE,
        "providers",
        &report.dropped.providers,
    );
    unread_line(&mut out, MODELS_FILE, &report.dropped.unread);
    skills_line(&mut out, &report.skills);
    match &report.append_system {
        PartOutcome::Staged(()) => {
            let _ = writeln!(out, "APPEND_SYSTEM.md: staged");
        }
        PartOutcome::NotOnHost => not_on_host(&mut out, "APPEND_SYSTEM.md"),
    }
    if !report.never_staged.is_empty() {
        let _ = writeln!(
            out,
            "never staged: {} (credentials and the host's own state stay on the host)",
            report.never_staged.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "Check what was staged: literal arguments and URL paths are copied as written, and every job can read them."
    );
    let _ = writeln!(out, "Next: pi-dispatch doctor");
    out
}

/// What became of the host's `models.json`: its providers and the variables it references.
fn models_line(out: &mut String, models: &PartOutcome<config::models::Models>) {
    match models {
        PartOutcome::Staged(m) => {
            let refs = if m.references.is_empty() {
                String::new()
            } else {
                let names: Vec<&str> = m.references.iter().map(String::as_str).collect();
                format!("; references {}", names.join(", "))
            };
            let _ = writeln!(
                out,
                "models.json: staged (providers: {}{refs})",
                m.providers.join(", ")
            );
        }
        PartOutcome::NotOnHost => not_on_host(out, "models.json"),
    }
}

/// What became of the host's `skills/`: the skills staged and what was never copied.
fn skills_line(out: &mut String, skills: &PartOutcome<import::SkillsStaged>) {
    match skills {
        PartOutcome::Staged(s) => {
            let _ = write!(
                out,
                "skills/: staged {} ({})",
                s.names.len(),
                s.names.join(", ")
            );
            let skipped: Vec<String> = s
                .copied
                .skipped_links
                .iter()
                .chain(&s.copied.skipped_other)
                .map(|p| p.display().to_string())
                .collect();
            if !skipped.is_empty() {
                let _ = write!(
                    out,
                    "; skipped {} (links and special files are never copied)",
                    skipped.join(", ")
                );
            }
            let _ = writeln!(out);
        }
        PartOutcome::NotOnHost => not_on_host(out, "skills/"),
    }
}

/// Names the servers or providers the overlay's `file` held that the import replaced away.
fn dropped_line(out: &mut String, file: &str, what: &str, names: &[String]) {
    if names.is_empty() {
        return;
    }
    let names: Vec<String> = names
        .iter()
        .map(|n| crate::output::display_name(n))
        .collect();
    let _ = writeln!(
        out,
        "  dropped from the overlay's {file} (the import replaces it; hand edits there are lost): {what} {}",
        names.join(", ")
    );
}

fn unread_line(out: &mut String, file: &'static str, unread: &[&'static str]) {
    if unread.contains(&file) {
        let _ = writeln!(
            out,
            "  the overlay's previous {file} could not be read, so what the import dropped from it is not known"
        );
    }
}

fn not_on_host(out: &mut String, what: &str) {
    let _ = writeln!(
        out,
        "{what}: not on the host; the overlay's, if it has one, is left as it is"
    );
}

fn mcp_lines(out: &mut String, outcome: &McpOutcome) {
    let Some(plan) = mcp_summary(out, outcome) else {
        return;
    };
    let width = plan
        .staged
        .iter()
        .map(|s| s.name.len())
        .chain(
            plan.left
                .iter()
                .map(|l| crate::output::display_name(&l.name).len()),
        )
        .max()
        .unwrap_or(0);
    staged_lines(out, plan, width);
    left_lines(out, plan, width);
    if !plan.not_carried.is_empty() {
        let _ = writeln!(
            out,
            "  pi settings in the host file, not carried into jobs: {}",
            plan.not_carried.join(", ")
        );
    }
}

/// The line that says what became of `mcp.json`, and the import's plan when servers were judged.
fn mcp_summary<'a>(out: &mut String, outcome: &'a McpOutcome) -> Option<&'a McpImport> {
    let removed_note = |removed: bool| {
        if removed {
            "; the overlay's mcp.json was removed"
        } else {
            ""
        }
    };
    match outcome {
        McpOutcome::NoMcp { removed } => {
            let _ = writeln!(
                out,
                "mcp.json: --no-mcp, no server staged{}",
                removed_note(*removed)
            );
            None
        }
        McpOutcome::NoHostFile { removed } => {
            let _ = writeln!(
                out,
                "mcp.json: none on the host, no server staged{}",
                removed_note(*removed)
            );
            None
        }
        McpOutcome::Imported { plan, removed } => {
            let _ = writeln!(
                out,
                "mcp.json: {} staged, {} left behind{}",
                count(plan.staged.len(), "server"),
                plan.left.len(),
                if plan.staged.is_empty() {
                    removed_note(*removed)
                } else {
                    ""
                }
            );
            Some(plan)
        }
    }
}

/// A line for each server staged, names padded to `width`: its transport, the variables it
/// references, the package runner it uses.
fn staged_lines(out: &mut String, plan: &McpImport, width: usize) {
    for s in &plan.staged {
        let mut notes = Vec::new();
        if !s.references.is_empty() {
            notes.push(format!("references {}", s.references.join(", ")));
        }
        if let Some(r) = s.package_runner {
            notes.push(format!("uses the package runner {r}"));
        }
        let line = format!(
            "  staged  {:<width$}  {:<5}  {}",
            s.name,
            s.transport.as_str(),
            notes.join("; ")
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// A line for each server left behind, names padded to `width`, with why.
fn left_lines(out: &mut String, plan: &McpImport, width: usize) {
    for l in &plan.left {
        let transport = l.transport.map_or("?", |t| t.as_str());
        let name = crate::output::display_name(&l.name);
        match &l.reason {
            LeftReason::TurnedOff => {
                let _ = writeln!(
                    out,
                    "  left    {name:<width$}  {transport:<5}  turned off on the host (\"enabled\": false)"
                );
            }
            LeftReason::Refused(problems) => {
                let _ = writeln!(out, "  left    {name:<width$}  {transport}");
                for p in problems {
                    let _ = writeln!(out, "      {p}");
                }
            }
        }
    }
}

fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}
