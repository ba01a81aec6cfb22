//! `pi-dispatch egress-proxy`: the egress proxy of jobs with egress on, in the foreground. The
//! worker starts one itself when none answers (and restarts it if it stops); run it on its own to
//! share one proxy among the workers of a host (they find it by `PI_EGRESS_PROXY_DIR`).
//!
//! It reads `egress-allowlist.conf` and `model-endpoints.json` again whenever either changes, logs
//! one line a decision, and stops on SIGTERM or SIGINT, closing its jobs' sockets.

use std::time::Duration;

use egress::Limits;
use egress::dns::Resolver;
use egress::files::RuleFiles;
use egress::service::{self, Options};

use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Connections one job may hold open at once.
    #[arg(long, value_name = "N", default_value_t = Limits::default().per_job)]
    per_job: usize,
    /// Connections the proxy holds open at once, in all.
    #[arg(long, value_name = "N", default_value_t = Limits::default().total)]
    total: usize,
    /// Seconds a tunnel may carry nothing before it is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = Limits::default().idle_timeout.as_secs())]
    idle: u64,
    /// The worker that started this proxy: it stops (as on SIGTERM) when that worker's thread
    /// that started it ends, however the worker ends.
    #[arg(long, value_name = "PID", hide = true)]
    worker_pid: Option<u32>,
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    if let Some(worker) = args.worker_pid {
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
            .map_err(|e| anyhow::anyhow!("cannot tie the proxy to its worker ({e})"))?;
        // The worker may have ended before the line above: then there is nobody to serve.
        let parent = rustix::process::getppid().map(rustix::process::Pid::as_raw_nonzero);
        if parent.map(|p| p.get().unsigned_abs()) != Some(worker) {
            anyhow::bail!("the worker that started this proxy is gone");
        }
    }
    let settings = ctx.settings()?;
    if args.per_job == 0 || args.total == 0 || args.idle == 0 {
        anyhow::bail!("--per-job, --total and --idle must be at least 1");
    }
    let options = Options {
        dir: settings.egress_proxy_dir.clone(),
        files: RuleFiles {
            allowlist: settings.egress_allowlist.clone(),
            endpoints: settings.model_endpoints.clone(),
        },
        resolver: settings
            .egress_nameserver
            .map_or(Resolver::System, Resolver::Nameserver),
        limits: Limits {
            per_job: args.per_job,
            total: args.total,
            idle_timeout: Duration::from_secs(args.idle),
            ..Limits::default()
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let started = service::start(options)?;
        println!("egress proxy: control socket {}", started.socket.display());
        wait_for_signal().await?;
        tracing::info!(event = "egress_proxy_stopping");
        started.stop();
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(Exit::Success)
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
