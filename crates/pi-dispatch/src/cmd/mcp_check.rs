//! `pi-dispatch mcp check [--overlay DIR] [--json]`: the verdict on the overlay's mcp.json.
//!
//! Exit 0 when every server is valid, 1 when any server is refused, 2 when the file cannot be read
//! as a whole (or the command is misused). A warning on a valid server never changes the exit code.

use std::fmt::Write as _;
use std::path::PathBuf;

use config::mcp::{self, Overlay, OverlayError, ServerEntry};
use serde::Serialize;

use crate::context::Context;
use crate::exit::Exit;
use crate::output::{FileError, print_report, read_and_parse};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The overlay folder [default: PI_GLOBAL_PI_DIR from the environment or ./.env, else ./pi-global]
    #[arg(long, value_name = "DIR")]
    overlay: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    let dir = ctx.overlay_dir(args.overlay.as_deref())?;
    let file = dir.join("mcp.json");
    let verdict = read_and_parse(&file, mcp::MAX_FILE_BYTES, mcp::parse_overlay);
    let report = Report::new(file.display().to_string(), &verdict);
    print_report(args.json, &report, || report.human())?;
    Ok(report.exit())
}

/// Why the file as a whole cannot be used.
type Unreadable = FileError<OverlayError>;

impl Unreadable {
    fn message(&self) -> String {
        match self {
            FileError::Read(e) => format!("mcp.json {e}"),
            FileError::Parse(e) => e.to_string(),
        }
    }
}

/// The report, in the shape `--json` prints. Extra keys beyond the documented ones:
/// `codemodeModels`, and per server `references`, `packageRunner` and `warnings`.
#[derive(Debug, Serialize)]
pub struct Report {
    file: String,
    readable: bool,
    #[serde(rename = "codemodeModels", skip_serializing_if = "Option::is_none")]
    codemode_models: Option<bool>,
    problems: Vec<FileProblem>,
    servers: Vec<ServerReport>,
}

#[derive(Debug, Serialize)]
struct FileProblem {
    code: &'static str,
    message: String,
}

#[derive(Debug, Serialize)]
struct ServerReport {
    name: String,
    offered: bool,
    enabled: bool,
    transport: Option<&'static str>,
    #[serde(rename = "packageRunner")]
    package_runner: Option<&'static str>,
    /// The variables the entry references (names only).
    references: Vec<String>,
    problems: Vec<ServerProblem>,
    /// Notes on a valid server that do not refuse it.
    warnings: Vec<ServerWarning>,
}

#[derive(Debug, Serialize)]
struct ServerWarning {
    code: &'static str,
    field: String,
    message: String,
    fix: String,
}

#[derive(Debug, Serialize)]
struct ServerProblem {
    code: &'static str,
    field: String,
    message: String,
}

impl Report {
    fn new(file: String, verdict: &Result<Overlay, Unreadable>) -> Report {
        match verdict {
            Ok(overlay) => Report {
                file,
                readable: true,
                codemode_models: Some(overlay.codemode_models),
                problems: Vec::new(),
                servers: overlay.servers.iter().map(ServerReport::new).collect(),
            },
            Err(e) => Report {
                file,
                readable: false,
                codemode_models: None,
                problems: vec![FileProblem {
                    code: e.code(),
                    message: e.message(),
                }],
                servers: Vec::new(),
            },
        }
    }

    fn exit(&self) -> Exit {
        if !self.readable {
            Exit::Unusable
        } else if self.servers.iter().any(|s| !s.problems.is_empty()) {
            Exit::CheckFailed
        } else {
            Exit::Success
        }
    }

    fn human(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "mcp.json: {}", self.file);
        if !self.readable {
            for p in &self.problems {
                let _ = writeln!(out, "✗ cannot be read: {} [{}]", p.message, p.code);
            }
            return out;
        }
        if self.codemode_models == Some(false) {
            let _ = writeln!(
                out,
                "  codemodeModels: false (codemode scripts cannot call models.* in any job)"
            );
        }
        let width = self
            .servers
            .iter()
            .map(|s| crate::output::display_name(&s.name).chars().count())
            .max()
            .unwrap_or(0);
        let (mut offered, mut off, mut refused) = (0, 0, 0);
        for s in &self.servers {
            let name = crate::output::display_name(&s.name);
            let transport = s.transport.unwrap_or("?");
            let (mark, verdict) = if !s.problems.is_empty() {
                refused += 1;
                ("✗", "refused".to_owned())
            } else if !s.enabled {
                off += 1;
                ("-", "turned off (\"enabled\": false)".to_owned())
            } else {
                offered += 1;
                match s.package_runner {
                    Some(r) => ("✓", format!("offered; uses the package runner {r}")),
                    None => ("✓", "offered".to_owned()),
                }
            };
            let _ = writeln!(out, "{mark} {name:<width$}  {transport:<5}  {verdict}");
            for p in &s.problems {
                if p.field.is_empty() {
                    let _ = writeln!(out, "    {} [{}]", p.message, p.code);
                } else {
                    let _ = writeln!(out, "    {}: {} [{}]", p.field, p.message, p.code);
                }
            }
            for w in &s.warnings {
                let _ = writeln!(
                    out,
                    "    ⚠ {}: {}; {} [{}]",
                    w.field, w.message, w.fix, w.code
                );
            }
        }
        let servers = match self.servers.len() {
            1 => "1 server".to_owned(),
            n => format!("{n} servers"),
        };
        let warnings = match self.servers.iter().map(|s| s.warnings.len()).sum() {
            0 => String::new(),
            1 => "; 1 warning".to_owned(),
            n => format!("; {n} warnings"),
        };
        let _ = writeln!(
            out,
            "{servers}: {offered} offered, {off} turned off, {refused} refused{warnings}"
        );
        out
    }
}

impl ServerReport {
    fn new(entry: &ServerEntry) -> ServerReport {
        let valid = entry.verdict.as_ref().ok();
        ServerReport {
            name: entry.name.clone(),
            offered: entry.offered().is_some(),
            enabled: entry.enabled,
            transport: entry.transport.map(|t| t.as_str()),
            package_runner: valid.and_then(|s| s.package_runner()),
            references: valid
                .map(|s| s.references().into_iter().map(|n| n.to_string()).collect())
                .unwrap_or_default(),
            problems: entry
                .problems()
                .iter()
                .map(|p| ServerProblem {
                    code: p.code.as_str(),
                    field: p.field.clone(),
                    message: p.message.clone(),
                })
                .collect(),
            warnings: valid
                .map(|s| {
                    s.warnings()
                        .into_iter()
                        .map(|w| ServerWarning {
                            code: w.code,
                            field: w.field,
                            message: w.message,
                            fix: w.fix,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}
