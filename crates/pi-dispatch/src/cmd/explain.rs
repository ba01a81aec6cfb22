//! `pi-dispatch explain --trigger N [--event FILE] [--json]`: what pickup would decide now for the
//! job trigger N would queue, without queueing or running anything.

use std::fmt::Write as _;
use std::path::PathBuf;

use config::files;
use config::json::{Json, Object};
use config::triggers::{self, Action};
use pickup::fs::{DeploymentFiles, ImageFolders, ProcessEnv};
use pickup::gates::{self, Decision, Inputs};
use pickup::job::Job;

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The index of the trigger in triggers.json (from 0).
    #[arg(long, value_name = "N")]
    trigger: usize,
    /// A forge event (JSON) to explain the job for; it is read and checked, and the MCP decision
    /// does not depend on its content.
    #[arg(long, value_name = "FILE")]
    event: Option<PathBuf>,
    /// Print the decision as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    let settings = ctx.settings()?;
    let bytes = files::read_file(&settings.triggers_file, triggers::MAX_FILE_BYTES)
        .map_err(|e| anyhow::anyhow!("{} {e}", settings.triggers_file.display()))?;
    let all = triggers::parse_triggers(&bytes)
        .map_err(|e| anyhow::anyhow!("{} is refused: {e}", settings.triggers_file.display()))?;
    let trigger = all.triggers.get(args.trigger).ok_or_else(|| {
        anyhow::anyhow!(
            "{} has no trigger {} (it has {})",
            settings.triggers_file.display(),
            args.trigger,
            all.triggers.len()
        )
    })?;
    if let Some(event) = &args.event {
        let path = ctx.absolute(event);
        let bytes = files::read_file(&path, 16 * 1024 * 1024)
            .map_err(|e| anyhow::anyhow!("{} {e}", path.display()))?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| anyhow::anyhow!("{} is not UTF-8 text", path.display()))?;
        if config::json::parse(text)?.as_object().is_none() {
            anyhow::bail!("{} is not a JSON object", path.display());
        }
    }
    let job = Job::from_trigger("explain", trigger);
    let decision = gates::decide(&Inputs {
        job: &job,
        trigger_now: Some(trigger),
        settings: &settings,
        files: &DeploymentFiles::new(&settings),
        images: &ImageFolders::new(&settings.dir),
        env: &ProcessEnv,
    });
    let report = report(&decision)?;
    let text = if args.json {
        config::json::to_pretty(&report)
    } else {
        human(trigger, &decision)
    };
    crate::output::print(&text)?;
    Ok(match decision {
        Decision::Admit { .. } => Exit::Success,
        Decision::Refuse(_) | Decision::Retry { .. } => Exit::CheckFailed,
    })
}

/// The JSON report, built on the order-keeping JSON type so that `mcpJson` shows the job's file in
/// its own order.
fn report(decision: &Decision) -> anyhow::Result<Json> {
    let text = |v: &str| Json::String(v.to_owned());
    let object = |members: Vec<(&str, Json)>| {
        Json::Object(Object::from_members(
            members
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        ))
    };
    Ok(match decision {
        Decision::Admit { mcp } => object(vec![
            ("outcome", text("admit")),
            ("reason", Json::Null),
            ("comment", Json::Null),
            ("log", Json::Null),
            (
                "mcpJson",
                match mcp {
                    Some(file) => config::json::parse(&file.text)?,
                    None => Json::Null,
                },
            ),
            (
                "mcpDigest",
                mcp.as_ref().map_or(Json::Null, |f| text(&f.digest)),
            ),
        ]),
        Decision::Refuse(r) => object(vec![
            ("outcome", text("policy")),
            ("reason", text(r.reason.as_str())),
            ("comment", text(&r.comment)),
            ("log", config::json::parse(&serde_json::to_string(&r.log)?)?),
            ("mcpJson", Json::Null),
            ("server", r.server.as_deref().map_or(Json::Null, text)),
        ]),
        Decision::Retry { detail } => object(vec![
            ("outcome", text("retry")),
            ("reason", Json::Null),
            ("comment", Json::Null),
            (
                "log",
                object(vec![
                    ("event", text("pickup_retry")),
                    ("detail", text(detail)),
                ]),
            ),
            ("mcpJson", Json::Null),
        ]),
    })
}

fn human(trigger: &triggers::Trigger, decision: &Decision) -> String {
    let mut out = String::new();
    let action = match &trigger.run.action {
        Action::Flow(f) => format!("flow {f}"),
        Action::Command(_) => "command".to_owned(),
    };
    let _ = writeln!(
        out,
        "explain: trigger {} ({} -> {} {action})",
        trigger.index,
        trigger.on.type_name(),
        trigger.run.kind.as_str()
    );
    match decision {
        Decision::Admit { mcp: None } => {
            let _ = writeln!(out, "✓ admit: the job would start, with no MCP server");
        }
        Decision::Admit { mcp: Some(file) } => {
            let _ = writeln!(
                out,
                "✓ admit: the job would start; its /job/mcp.json (digest {}):",
                file.digest
            );
            for line in file.text.lines() {
                let _ = writeln!(out, "    {line}");
            }
        }
        Decision::Refuse(r) => {
            let _ = writeln!(out, "✗ policy: {} (nothing would be spent)", r.reason);
            let _ = writeln!(out, "  comment: {}", r.comment);
            let _ = writeln!(out, "  log: {} {}", r.log.event, r.log.detail);
        }
        Decision::Retry { detail } => {
            let _ = writeln!(
                out,
                "⚠ retry: a read failed in a way that may pass ({detail})"
            );
        }
    }
    out
}
