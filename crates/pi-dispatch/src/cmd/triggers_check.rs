//! `pi-dispatch triggers check [FILE] [--json]`: the verdict on triggers.json.
//!
//! Exit 0 when every trigger is valid, 1 when the file is read but refused (`triggers-invalid`), 2
//! when it cannot be read at all (or the command is misused). The file is refused whole, so the
//! report lists every error; of a valid file it shows each trigger's type, kind, flow name and MCP
//! names, never a command, task, secret reference, label, phrase or any other value.
//!
//! Of a valid file it also warns, without changing the exit code, of each `run.mcp` name the
//! overlay's `mcp.json` does not offer (read as `mcp check` reads it), or once that the overlay cannot
//! be read, when a trigger names any server but `forge`.

use std::fmt::Write as _;
use std::path::PathBuf;

use config::files::ReadError;
use config::mcp;
use config::settings;
use config::triggers::{Action, FileRefusal, Trigger, Triggers, TriggersError, TriggersFile};
use serde::Serialize;

use crate::context::Context;
use crate::exit::Exit;
use crate::output::{FileError, print_report, read_and_parse};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The triggers file, relative to the current folder [default: PI_TRIGGERS_FILE from the
    /// environment or ./.env, else triggers.json in the deployment folder]
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    let file = match &args.file {
        Some(file) => ctx.absolute(file),
        None => match ctx.setting(settings::TRIGGERS_SETTING)? {
            Some(value) => ctx.dir.join(value),
            None => ctx.dir.join(settings::TRIGGERS_FILE),
        },
    };
    // The file is read as the worker reads it, except that a missing one is an error here: there
    // is nothing to check.
    let verdict = TriggersFile::read(&file).and_then(|read| match read.exists {
        true => Ok(read.triggers),
        false => Err(FileRefusal::Unreadable {
            path: read.path,
            error: ReadError::Missing,
        }),
    });
    let mut report = Report::new(file.display().to_string(), &verdict);
    if let Ok(triggers) = &verdict
        && triggers.names_overlay_servers()
    {
        report.warnings = overlay_warnings(ctx, triggers);
    }
    print_report(args.json, &report, || report.human())?;
    Ok(report.exit())
}

/// Whether the file was read as JSON and refused for its triggers, rather than unreadable.
fn is_invalid(refusal: &FileRefusal) -> bool {
    matches!(
        refusal,
        FileRefusal::Refused {
            error: TriggersError::Invalid(_),
            ..
        }
    )
}

/// What the report says of a file that is not used: every error, the file's by trigger and field,
/// or one for the file as a whole (empty path).
fn errors(refusal: &FileRefusal) -> Vec<ErrorReport> {
    match refusal {
        FileRefusal::Unreadable { error, .. } => {
            vec![ErrorReport::whole(format!("triggers.json {error}"))]
        }
        FileRefusal::Refused {
            error: TriggersError::Invalid(errors),
            ..
        } => errors
            .iter()
            .map(|e| ErrorReport {
                path: e.path.clone(),
                message: e.message.clone(),
            })
            .collect(),
        FileRefusal::Refused { error, .. } => vec![ErrorReport::whole(error.to_string())],
    }
}

/// The report, in the shape `--json` prints. A file that cannot be read has one error, with an
/// empty path.
#[derive(Debug, Serialize)]
pub struct Report {
    file: String,
    valid: bool,
    code: Option<&'static str>,
    errors: Vec<ErrorReport>,
    triggers: Vec<TriggerReport>,
    /// Of a valid file: each name the overlay does not offer, by path; or one, with an empty path,
    /// saying that the overlay cannot be read.
    warnings: Vec<ErrorReport>,
    /// Whether the file could be read as JSON (not printed: `code` tells it).
    #[serde(skip)]
    readable: bool,
}

#[derive(Debug, Serialize)]
struct ErrorReport {
    /// Where, as `triggers[2].run.mcp[1]`; empty for the file as a whole.
    path: String,
    message: String,
}

impl ErrorReport {
    fn whole(message: String) -> ErrorReport {
        ErrorReport {
            path: String::new(),
            message,
        }
    }
}

#[derive(Debug, Serialize)]
struct TriggerReport {
    index: usize,
    #[serde(rename = "type")]
    on_type: &'static str,
    kind: &'static str,
    /// The flow's name; `None` for a command, whose text is never shown.
    #[serde(skip)]
    flow: Option<String>,
    mcp: Option<Vec<String>>,
}

impl Report {
    fn new(file: String, verdict: &Result<Triggers, FileRefusal>) -> Report {
        match verdict {
            Ok(triggers) => Report {
                file,
                valid: true,
                code: None,
                errors: Vec::new(),
                triggers: triggers.triggers.iter().map(TriggerReport::new).collect(),
                warnings: Vec::new(),
                readable: true,
            },
            Err(e) => Report {
                file,
                valid: false,
                code: Some(e.code()),
                errors: errors(e),
                triggers: Vec::new(),
                warnings: Vec::new(),
                readable: is_invalid(e),
            },
        }
    }

    fn exit(&self) -> Exit {
        if !self.readable {
            Exit::Unusable
        } else if !self.valid {
            Exit::CheckFailed
        } else {
            Exit::Success
        }
    }

    fn human(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "triggers.json: {}", self.file);
        if !self.readable {
            let code = self.code.unwrap_or_default();
            for e in &self.errors {
                let _ = writeln!(out, "✗ cannot be read: {} [{code}]", e.message);
            }
            return out;
        }
        if !self.valid {
            let errors = match self.errors.len() {
                1 => "1 error".to_owned(),
                n => format!("{n} errors"),
            };
            let _ = writeln!(out, "✗ the file is refused whole ({errors}):");
            for e in &self.errors {
                if e.path.is_empty() {
                    let _ = writeln!(out, "    {}", e.message);
                } else {
                    let _ = writeln!(out, "    {}: {}", e.path, e.message);
                }
            }
            return out;
        }
        for t in &self.triggers {
            let action = match &t.flow {
                Some(flow) => format!("flow {flow}"),
                None => "command".to_owned(),
            };
            let _ = write!(out, "✓ [{}] {} -> {} {action}", t.index, t.on_type, t.kind);
            match &t.mcp {
                Some(names) => {
                    let _ = writeln!(out, "; mcp: {}", names.join(", "));
                }
                None => out.push('\n'),
            }
        }
        for w in &self.warnings {
            if w.path.is_empty() {
                let _ = writeln!(out, "⚠ {}", w.message);
            } else {
                let _ = writeln!(out, "⚠ {}: {}", w.path, w.message);
            }
        }
        let triggers = match self.triggers.len() {
            1 => "1 trigger".to_owned(),
            n => format!("{n} triggers"),
        };
        let warnings = match self.warnings.len() {
            0 => String::new(),
            1 => "; 1 warning".to_owned(),
            n => format!("; {n} warnings"),
        };
        let _ = writeln!(out, "{triggers}: all valid{warnings}");
        out
    }
}

/// What the overlay's `mcp.json` says of the servers the triggers name, read as `mcp check` reads
/// it (`PI_GLOBAL_PI_DIR`, else `pi-global` in the deployment folder).
fn overlay_warnings(ctx: &Context, triggers: &Triggers) -> Vec<ErrorReport> {
    let unchecked = "so the servers the triggers name are not checked; every job that names a server other than forge is refused (mcp-config-invalid)";
    let dir = match ctx.overlay_dir(None) {
        Ok(dir) => dir,
        Err(e) => {
            return vec![ErrorReport::whole(format!(
                "the overlay folder cannot be told ({e}), {unchecked}"
            ))];
        }
    };
    let file = dir.join("mcp.json");
    match read_and_parse(&file, mcp::MAX_FILE_BYTES, mcp::parse_overlay) {
        Ok(overlay) => triggers
            .unoffered(&overlay)
            .into_iter()
            .map(|u| ErrorReport {
                path: u.path,
                message: format!(
                    "the overlay does not offer '{}': its mcp.json {}; a job of this trigger is refused (mcp-server-unknown)",
                    u.name,
                    u.why.as_str()
                ),
            })
            .collect(),
        Err(e) => {
            let why = match &e {
                FileError::Read(r) => format!("mcp.json {r}"),
                FileError::Parse(p) => p.to_string(),
            };
            vec![ErrorReport::whole(format!(
                "the overlay's {} cannot be read ({why} [{}]), {unchecked}",
                file.display(),
                e.code()
            ))]
        }
    }
}

impl TriggerReport {
    fn new(trigger: &Trigger) -> TriggerReport {
        TriggerReport {
            index: trigger.index,
            on_type: trigger.on.type_name(),
            kind: trigger.run.kind.as_str(),
            flow: match &trigger.run.action {
                Action::Flow(name) => Some(name.clone()),
                Action::Command(_) => None,
            },
            mcp: trigger
                .run
                .mcp
                .as_ref()
                .map(|names| names.iter().map(|n| n.as_str().to_owned()).collect()),
        }
    }
}
