//! `pi-dispatch receiver [--listen ADDR]`: takes GitHub and GitLab webhooks and queues the jobs of
//! the triggers they match, for the worker to run (docs/receiver.md). It never runs a job.
//!
//! GitHub's webhooks are taken when `PI_GITHUB_WEBHOOK_SECRET` is set, GitLab's when
//! `PI_GITLAB_WEBHOOK_TOKEN` is; at least one must be. It listens on `PI_RECEIVER_LISTEN`
//! (loopback port 8780 by default): put a TLS proxy in front of it. SIGTERM or SIGINT stops it once
//! the requests in flight are answered.

use std::time::Duration;

use receiver::server::{self, Secret};

use crate::cmd::http_service;
use crate::context::Context;
use crate::exit::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The address and port to listen on [default: PI_RECEIVER_LISTEN, else 127.0.0.1:8780].
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<String>,
    /// The largest body read, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = server::DEFAULT_MAX_BODY)]
    max_body: usize,
    /// Seconds one request may take, its body included.
    #[arg(long, value_name = "SECONDS", default_value_t = server::DEFAULT_TIMEOUT.as_secs())]
    timeout: u64,
}

pub fn run(args: &Args, ctx: &Context) -> anyhow::Result<Exit> {
    ctx.deployment()?;
    let settings = ctx.settings()?;
    let env = ctx.environment()?;
    let addr = http_service::address(
        ctx,
        args.listen.as_deref(),
        receiver::LISTEN_SETTING,
        receiver::DEFAULT_LISTEN,
    )?;
    if args.max_body == 0 || args.timeout == 0 {
        anyhow::bail!("--max-body and --timeout must be above 0");
    }
    let github_secret = env
        .get(receiver::GITHUB_SECRET_SETTING)
        .map(|s| Secret::new(&s));
    let gitlab_token = env
        .get(receiver::GITLAB_TOKEN_SETTING)
        .map(|s| Secret::new(&s));
    if github_secret.is_none() && gitlab_token.is_none() {
        anyhow::bail!(
            "neither {} nor {} is set: the receiver would take no webhook",
            receiver::GITHUB_SECRET_SETTING,
            receiver::GITLAB_TOKEN_SETTING
        );
    }
    let queue = ctx.queue(&settings)?;
    let config = server::Config {
        queue,
        triggers_file: settings.triggers_file.clone(),
        github_secret,
        gitlab_token,
        max_body: args.max_body,
        timeout: Duration::from_secs(args.timeout),
    };
    let (github, gitlab) = (
        config.github_secret.is_some(),
        config.gitlab_token.is_some(),
    );
    http_service::run(
        addr,
        "receiver",
        |addr| tracing::info!(event = "receiver_listening", addr = %addr, github, gitlab),
        |listener| server::serve(listener, config, http_service::stop_signal()),
    )?;
    tracing::info!(event = "receiver_stopped");
    Ok(Exit::Success)
}
