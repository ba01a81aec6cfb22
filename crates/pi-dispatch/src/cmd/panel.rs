//! `pi-dispatch panel [--listen ADDR]`: the web panel (the queue, the runs and why each ended, the
//! deployment's health, cancelling a job) and Prometheus metrics at `/metrics` (docs/panel.md).
//!
//! The operator's token is `PI_PANEL_TOKEN`, from the environment or the deployment's `.env`,
//! never an argument. The panel listens on `PI_PANEL_LISTEN` (loopback port 8790 by default).
//! SIGTERM or SIGINT stops it once the requests in flight are answered.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The address and port to listen on [default: PI_PANEL_LISTEN, else 127.0.0.1:8790].
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<String>,
    /// Seconds between two reads of the records.
    #[arg(long, value_name = "SECONDS", default_value_t = 2)]
    refresh: u64,
}

/// Doctor's checks at most this often: a page reload does not start a sandbox each time.
const HEALTH_FOR: Duration = Duration::from_secs(30);

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    let settings = ctx.settings()?;
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
    let listen = match &args.listen {
        Some(l) => l.clone(),
        None => ctx
            .setting(panel::LISTEN_SETTING)?
            .unwrap_or_else(|| panel::DEFAULT_LISTEN.to_owned()),
    };
    let addr: std::net::SocketAddr = listen.parse().map_err(|_| {
        anyhow::anyhow!(
            "--listen (or {}) must be an address and port, such as 127.0.0.1:8790",
            panel::LISTEN_SETTING
        )
    })?;
    if args.refresh == 0 {
        anyhow::bail!("--refresh must be above 0");
    }
    let dir = ctx.dir.clone();
    let last: Mutex<Option<(Instant, Vec<panel::Health>)>> = Mutex::new(None);
    let health = move || {
        let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, checks)) = last.as_ref()
            && at.elapsed() < HEALTH_FOR
        {
            return checks.clone();
        }
        let checks = health_checks(&dir);
        *last = Some((Instant::now(), checks.clone()));
        checks
    };
    let config = panel::Config {
        token,
        queue: ctx.queue(&settings)?,
        records: Arc::new(crate::cmd::runs::records(ctx)?),
        jobs_dir: ctx.dir.join("state").join("jobs"),
        health: Arc::new(health),
        refresh: Duration::from_secs(args.refresh),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} ({})", e.kind()))?;
        let addr = listener.local_addr().unwrap_or(addr);
        if !addr.ip().is_loopback() {
            tracing::warn!(event = "panel_not_loopback", addr = %addr,
                detail = "the panel is reachable from other machines: put a TLS proxy in front of it");
        }
        tracing::info!(event = "panel_listening", addr = %addr);
        panel::serve(listener, config, crate::cmd::receiver::stop_signal())
            .await
            .map_err(|e| anyhow::anyhow!("the panel stopped: {e}"))?;
        tracing::info!(event = "panel_stopped");
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(Exit::Success)
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
