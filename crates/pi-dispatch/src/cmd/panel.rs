//! `pi-dispatch panel [--listen ADDR]`: the web panel (the queue, the runs and why each ended, the
//! deployment's health, cancelling a job) and Prometheus metrics at `/metrics` (docs/panel.md).
//!
//! The operator's token is `PI_PANEL_TOKEN`, from the environment or the deployment's `.env`,
//! never an argument. The panel listens on `PI_PANEL_LISTEN` (loopback port 8790 by default).
//! SIGTERM or SIGINT stops it once the requests in flight are answered.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::cmd::http_service;
use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The address and port to listen on [default: PI_PANEL_LISTEN, else 127.0.0.1:8790].
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<String>,
}

/// Doctor's checks at most this often: a page reload does not start a sandbox each time.
const HEALTH_FOR: Duration = Duration::from_secs(30);

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    ctx.deployment()?;
    let settings = ctx.settings()?;
    let token = operator_token(ctx)?;
    let addr = http_service::address(
        ctx,
        args.listen.as_deref(),
        panel::LISTEN_SETTING,
        panel::DEFAULT_LISTEN,
    )?;
    let trusted_proxies = trusted_proxies(ctx)?;
    let config = panel::Config {
        token,
        queue: ctx.queue(&settings)?,
        records: Arc::new(crate::cmd::runs::records(ctx)?),
        jobs_dir: ctx.dir.join("state").join("jobs"),
        health: Arc::new(cached_health(ctx.dir.clone())),
        state_dir: ctx.dir.join("state"),
        worker_gone_after: settings.worker_gone_after(),
        trusted_proxies,
        rerun: Arc::new(rerun_in(ctx.dir.clone())),
    };
    http_service::run(
        addr,
        "panel",
        |addr| {
            if !addr.ip().is_loopback() {
                tracing::warn!(event = "panel_not_loopback", addr = %addr,
                    detail = "the panel is reachable from other machines: put a TLS proxy in front of it");
            }
            tracing::info!(event = "panel_listening", addr = %addr);
        },
        |listener| panel::serve(listener, config, http_service::stop_signal()),
    )?;
    tracing::info!(event = "panel_stopped");
    Ok(Exit::Success)
}

/// The operator's token (`PI_PANEL_TOKEN`), refused when shorter than the panel takes.
fn operator_token(ctx: &Context) -> anyhow::Result<String> {
    let token = ctx
        .environment()?
        .get(panel::TOKEN_SETTING)
        .unwrap_or_default();
    if token.chars().count() < panel::MIN_TOKEN {
        anyhow::bail!(
            "{} must be set (in the environment or the deployment's .env) to a token of at least {} characters: the panel serves nothing without it",
            panel::TOKEN_SETTING,
            panel::MIN_TOKEN
        );
    }
    Ok(token)
}

/// The proxies the panel believes about the client (`PI_PANEL_TRUSTED_PROXIES`).
fn trusted_proxies(ctx: &Context) -> anyhow::Result<Vec<std::net::IpAddr>> {
    let proxies = ctx
        .environment()?
        .get(panel::client::TRUSTED_PROXIES_SETTING)
        .unwrap_or_default();
    panel::client::trusted_proxies(&proxies).map_err(|n| {
        anyhow::anyhow!(
            "{}: entry {n} is not an IP address (the proxies the panel believes about the client, by commas)",
            panel::client::TRUSTED_PROXIES_SETTING
        )
    })
}

/// Doctor's checks of the deployment in `dir` for the health page, kept for [`HEALTH_FOR`].
fn cached_health(dir: std::path::PathBuf) -> impl Fn() -> Vec<panel::Health> + Send + Sync {
    let last: Mutex<Option<(Instant, Vec<panel::Health>)>> = Mutex::new(None);
    move || {
        let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, checks)) = last.as_ref()
            && at.elapsed() < HEALTH_FOR
        {
            return checks.clone();
        }
        let checks = health_checks(&dir);
        *last = Some((Instant::now(), checks.clone()));
        checks
    }
}

/// The panel's "Run again": the deployment in `dir` read afresh, as the CLI's rerun reads it.
fn rerun_in(dir: std::path::PathBuf) -> impl Fn(&str) -> Result<String, String> + Send + Sync {
    move |id: &str| {
        let ctx = Context::new(Some(&dir)).map_err(|e| e.to_string())?;
        match crate::cmd::rerun::rerun(&ctx, id, false) {
            Ok(Ok(new)) => Ok(new),
            Ok(Err(not)) => Err(not.why),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Doctor's checks of the deployment in `dir`, read afresh (its `.env` included).
fn health_checks(dir: &std::path::Path) -> Vec<panel::Health> {
    let checks = Context::new(Some(dir)).and_then(|ctx| crate::cmd::doctor::checks(&ctx, false));
    match checks {
        Ok(checks) => checks
            .into_iter()
            .map(|c| panel::Health {
                level: match c.level {
                    setup::doctor::Level::Ok => "ok",
                    setup::doctor::Level::Warn => "warn",
                    setup::doctor::Level::Fail => "fail",
                }
                .to_owned(),
                label: c.label,
                fix: c.fix,
            })
            .collect(),
        Err(e) => vec![panel::Health {
            level: "fail".to_owned(),
            label: format!("doctor could not run: {e}"),
            fix: Some("run pi-dispatch doctor on this host".to_owned()),
        }],
    }
}
