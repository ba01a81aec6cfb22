//! `pi-dispatch explain --trigger N [--event FILE] [--json]`: what the worker would decide now for
//! the job trigger N would queue, without queueing or running anything. It asks the admission the
//! worker asks, with the deployment's files, images and environment, so "admit" here is what the
//! worker does.

use std::fmt::Write as _;
use std::path::PathBuf;

use config::files;
use config::json::{Json, Object};
use config::triggers::{self, Action, On};
use pickup::admission::Decision;
use protocol::job::Job;

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The index of the trigger in triggers.json (from 0).
    #[arg(long, value_name = "N")]
    trigger: usize,
    /// A forge event (JSON) to explain the job for; it is read and checked, and the decision
    /// does not depend on its content.
    #[arg(long, value_name = "FILE")]
    event: Option<PathBuf>,
    /// Print the decision as JSON.
    #[arg(long)]
    json: bool,
}

/// The job trigger `trigger` queues, under an id the worker would give it.
pub fn trigger_job(trigger: &triggers::Trigger) -> Job {
    let id = match &trigger.on {
        On::Cron { id, .. } => format!("cron-{id}-explain"),
        _ => "explain".to_owned(),
    };
    let mut job = trigger.job(id);
    // A forge trigger's job carries the event that queued it; the decision does not depend on
    // what the event says, only that there is one, so an example stands in for it.
    job.event = protocol::forge_event::Forge::of_kind(&job.kind)
        .map(protocol::forge_event::ForgeEvent::example);
    job
}

fn text(v: &str) -> Json {
    Json::String(v.to_owned())
}

fn object(members: Vec<(&str, Json)>) -> Json {
    Json::Object(Object::from_members(
        members
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    ))
}

fn value<T: serde::Serialize>(v: &T) -> anyhow::Result<Json> {
    Ok(config::json::parse(&serde_json::to_string(v)?)?)
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    ctx.deployment()?;
    let settings = ctx.settings()?;
    let file = settings.triggers_file.display().to_string();
    let all = match triggers::TriggersFile::read(&settings.triggers_file) {
        Ok(all) => all,
        Err(e) => return unusable(args, &file, &e.to_string()),
    };
    let trigger = match all.trigger(args.trigger) {
        Ok(trigger) => trigger,
        Err(why) => return unusable(args, &file, &why),
    };
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
    let job = trigger_job(trigger);
    let env = ctx.environment()?;
    let decision = pickup::fs::Deployment::new(&settings, &env)
        .with_github_key(crate::cmd::worker::github_key_usable(&settings))
        .decide(&job);
    let needs = match &decision {
        Decision::Admit(a) => egress_needs(a, &settings),
        _ => Vec::new(),
    };
    let out = if args.json {
        let mut report = report(&decision)?;
        if let (Json::Object(o), Decision::Admit(_)) = (&report, &decision) {
            let mut members: Vec<(String, Json)> =
                o.iter().map(|(k, v)| (k.to_owned(), v.clone())).collect();
            members.push(("egressNeeds".to_owned(), needs_json(&needs)));
            report = Json::Object(Object::from_members(members));
        }
        config::json::to_pretty(&report)
    } else {
        let mut out = human(trigger, &decision);
        out.push_str(&needs_text(&needs));
        if let Decision::Admit(a) = &decision
            && settings.egress
            && !needs.iter().any(|n| n.for_ == "model")
        {
            let _ = writeln!(
                out,
                "    model {}/{}: pi's built-in provider, at the address pi has for it: allowlist that host",
                a.model.provider, a.model.model
            );
        }
        out
    };
    crate::output::print(&out)?;
    Ok(match decision {
        Decision::Admit(_) => Exit::Success,
        Decision::Refuse(_) | Decision::Retry { .. } => Exit::CheckFailed,
    })
}

/// The triggers file cannot be used: said on stderr, and with `--json` as a JSON report too.
fn unusable(args: &Args, file: &str, why: &str) -> anyhow::Result<Exit> {
    if args.json {
        let report = object(vec![
            ("outcome", text("unusable")),
            ("file", text(file)),
            ("error", text(why)),
        ]);
        crate::output::print(&config::json::to_pretty(&report))?;
    }
    eprintln!("pi-dispatch: {why}");
    Ok(Exit::Unusable)
}

/// The JSON report, built on the order-keeping JSON type so that `mcpJson` shows the job's file in
/// its own order.
pub fn report(decision: &Decision) -> anyhow::Result<Json> {
    Ok(match decision {
        Decision::Admit(a) => object(vec![
            ("outcome", text("admit")),
            ("reason", Json::Null),
            ("admitted", value(a)?),
            (
                "mcpJson",
                match &a.mcp {
                    Some(file) => config::json::parse(&file.text)?,
                    None => Json::Null,
                },
            ),
            (
                "mcpDigest",
                a.mcp.as_ref().map_or(Json::Null, |f| text(&f.digest)),
            ),
        ]),
        Decision::Refuse(r) => object(vec![
            ("outcome", text("policy")),
            ("reason", text(r.reason.as_str())),
            ("sentence", text(r.sentence())),
            ("comment", text(&r.comment())),
            ("detail", value(&r.detail)?),
            ("fix", text(&r.fix)),
            (
                "server",
                r.detail.server.as_deref().map_or(Json::Null, text),
            ),
            ("mcpJson", Json::Null),
        ]),
        Decision::Retry { detail } => object(vec![
            ("outcome", text("retry")),
            ("reason", Json::Null),
            ("detail", text(detail)),
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
        Decision::Admit(a) => {
            let _ = writeln!(
                out,
                "✓ admit: the job would start, on image {}, in {} as uid {}, with {}/{}",
                a.image, a.workspace.path, a.workspace.uid, a.model.provider, a.model.model
            );
            match &a.mcp {
                None => {
                    let _ = writeln!(out, "  no MCP server");
                }
                Some(file) => {
                    let _ = writeln!(out, "  its /job/mcp.json (digest {}):", file.digest);
                    for line in file.text.lines() {
                        let _ = writeln!(out, "    {line}");
                    }
                }
            }
        }
        Decision::Refuse(r) => {
            let _ = writeln!(
                out,
                "✗ policy: {} (nothing would be spent): {}",
                r.reason,
                r.sentence()
            );
            let _ = writeln!(out, "  why: {}", r.detail.why);
            let _ = writeln!(out, "  fix: {}", r.fix);
            let _ = writeln!(out, "  comment: {}", r.comment());
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

/// A host and port the job will need with egress on, and whether the proxy lets it through.
struct Need {
    for_: String,
    host: String,
    port: u16,
    /// `allowlist`, `endpoint ID`, or why the proxy refuses it (a code of `config::egress`).
    verdict: Result<String, &'static str>,
}

/// What the admitted job will reach through the proxy (its servers, its model when its address is
/// known, the forge), judged by the rule the proxy applies, with the files as they are now.
fn egress_needs(
    a: &protocol::admitted::Admitted,
    settings: &config::settings::Settings,
) -> Vec<Need> {
    use protocol::admitted::Egress;
    let Egress::On { routes, .. } = &a.egress else {
        return Vec::new();
    };
    let read = |p: &std::path::Path| files::read_file(p, 1024 * 1024).ok();
    let allowlist = read(&settings.egress_allowlist)
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|t| config::egress::parse_allowlist(&t).ok())
        .unwrap_or_default();
    let endpoints = read(&settings.model_endpoints)
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|t| config::endpoints::parse_model_endpoints(&t).ok())
        .unwrap_or_default();
    routes
        .iter()
        .map(|r| {
            // The rule without a scheme: a declared endpoint takes any, the allowlist https on 443
            // (a plain http:// server on 443 is refused at the pickup already).
            let verdict = match config::url::host_port(&format!("https://{}:{}", r.host, r.port)) {
                None => Err("egress-not-allowed"),
                Some((host, port)) => match config::egress::route(
                    config::url::Scheme::Https,
                    &host,
                    port,
                    &allowlist,
                    &endpoints,
                ) {
                    Ok(config::egress::Route::Allowlisted) => Ok("allowlist".to_owned()),
                    Ok(config::egress::Route::DeclaredEndpoint { id }) => {
                        Ok(format!("endpoint {id}"))
                    }
                    Err(why) => Err(why.code()),
                },
            };
            Need {
                for_: r.for_.clone(),
                host: r.host.clone(),
                port: r.port,
                verdict,
            }
        })
        .collect()
}

fn needs_text(needs: &[Need]) -> String {
    if needs.is_empty() {
        return String::new();
    }
    let mut out = String::from("  egress: what the job will reach through the proxy\n");
    let mut lacking = Vec::new();
    for n in needs {
        let what = match n.for_.as_str() {
            "model" | "forge" => n.for_.clone(),
            server => format!("server {server}"),
        };
        match &n.verdict {
            Ok(how) => {
                let _ = writeln!(out, "    {what}: {}:{} ({how})", n.host, n.port);
            }
            Err(code) => {
                let _ = writeln!(
                    out,
                    "    {what}: {}:{} NOT reachable ({code})",
                    n.host, n.port
                );
                if n.port == 443 {
                    lacking.push(n.host.clone());
                }
            }
        }
    }
    if !lacking.is_empty() {
        let _ = writeln!(out, "  egress-allowlist.conf lacks: {}", lacking.join(", "));
    }
    out
}

fn needs_json(needs: &[Need]) -> Json {
    Json::Array(
        needs
            .iter()
            .map(|n| {
                object(vec![
                    ("for", text(&n.for_)),
                    ("host", text(&n.host)),
                    ("port", Json::Number(n.port.into())),
                    ("reachable", Json::Bool(n.verdict.is_ok())),
                    (
                        "how",
                        match &n.verdict {
                            Ok(h) => text(h),
                            Err(code) => text(code),
                        },
                    ),
                ])
            })
            .collect(),
    )
}
