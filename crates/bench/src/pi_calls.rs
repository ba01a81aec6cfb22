//! `--pi-calls`: a tool call as pi sees it. pi's own MCP client (`@earendil-works/pi-mcp` from the
//! pi package's dependencies, driven by a Node script, `pi_calls.mjs`) calls server-everything's
//! `echo`, taking turns between three ways:
//!
//! - **direct**: the server over stdio, as pi with its own MCP would start it;
//! - **relay**: the way a job's pi reaches the hub: stdio to `pi-dispatch job-relay`, which
//!   carries the bytes over the hub's unix socket; the hub relays to the same kind of server over
//!   stdio, connected the runner's way;
//! - **http**: the hub's loopback streamable-HTTP endpoint, the way pi reached it before.
//!
//! The hub runs in this process on the runtime `pi-dispatch job` builds
//! ([`hub::job::RUNTIME_WORKERS`] worker threads); pi's client is a process of its own.

use crate::mcp_hub::{Latency, Peers, connect, path_str, runner_runtime};
use crate::stats::{median, round1, round3};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use hub::relay::{Listeners, Withheld};
use serde_json::{Value, json};

/// A call through the hub as pi sees it should take at most this many times the direct stdio
/// call, at p50.
pub const GOAL_RATIO: f64 = 1.3;

/// The hub's token in this bench (letters and digits, as the runner's).
const TOKEN: &str = "pidispatchbenchpicalls0123456789";

const SCRIPT: &str = include_str!("pi_calls.mjs");

/// What the measurement needs.
pub struct Options {
    /// The pi-dispatch binary, whose `job-relay` is the relay.
    pub bin: PathBuf,
    pub node_modules: PathBuf,
    /// Timed calls per way, after `warm_up` rounds.
    pub calls: u32,
    pub warm_up: u32,
}

/// The three ways' latencies, µs.
pub struct PiCallFigures {
    calls: u32,
    direct: Latency,
    relay: Latency,
    http: Latency,
    /// Per round, the relay's time less the direct one's: the median.
    relay_added_p50: f64,
    http_added_p50: f64,
}

impl PiCallFigures {
    fn relay_ratio(&self) -> f64 {
        self.relay.p50 / self.direct.p50
    }

    fn http_ratio(&self) -> f64 {
        self.http.p50 / self.direct.p50
    }

    pub fn json(&self) -> Value {
        json!({
            "calls": self.calls,
            "direct": self.direct.json(),
            "relay": self.relay.json(),
            "http": self.http.json(),
            "relay_over_direct_p50": round3(self.relay_ratio()),
            "http_over_direct_p50": round3(self.http_ratio()),
            "relay_added_paired_p50_us": round1(self.relay_added_p50),
            "http_added_paired_p50_us": round1(self.http_added_p50),
            "goal_ratio": GOAL_RATIO,
            "meets_goal": self.relay_ratio() <= GOAL_RATIO,
        })
    }

    pub fn print(&self) {
        println!(
            "a tool call as pi sees it (pi's MCP client, {} echo calls per way, taking turns):",
            self.calls
        );
        for (name, l) in [
            ("direct over stdio", &self.direct),
            ("through the relay", &self.relay),
            ("over the hub's HTTP", &self.http),
        ] {
            println!(
                "  {name:<22} p50 {:>7.1} µs  p99 {:>7.1} µs  min {:>7.1} µs",
                l.p50, l.p99, l.min
            );
        }
        println!(
            "  relay/direct at p50 {:.3} (goal <= {GOAL_RATIO}), paired added {:.1} µs; http/direct {:.3}, paired added {:.1} µs",
            self.relay_ratio(),
            self.relay_added_p50,
            self.http_ratio(),
            self.http_added_p50
        );
    }
}

/// Connects server-everything the runner's way, serves it on loopback and on a socket, and runs
/// pi's client against it three ways.
pub fn measure(options: &Options) -> anyhow::Result<PiCallFigures> {
    let peers = Peers::find(&options.node_modules)?;
    let pi_mcp = options
        .node_modules
        .canonicalize()
        .context("the node_modules folder does not exist")?
        .join("@earendil-works/pi-mcp/dist/index.js");
    ensure!(
        pi_mcp.is_file(),
        "{} is missing: run `npm ci` at the workspace root",
        pi_mcp.display()
    );
    let runtime = runner_runtime()?;
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let socket = dir.path().join("hub.sock");
    let hub = runtime.block_on(async {
        let servers = vec![("everything".to_owned(), peers.stdio_entry()?)];
        let (connected, _) = connect(&peers, &servers, dir.path()).await?;
        let listener =
            tokio::net::UnixListener::bind(&socket).context("cannot bind the hub's socket")?;
        let listeners = Listeners {
            loopback: true,
            socket: Some(listener),
        };
        let upstreams = connected
            .upstreams
            .into_iter()
            .map(|(u, _)| (u, Withheld::none()))
            .collect();
        hub::relay::serve_on(upstreams, TOKEN.to_owned(), listeners)
            .await
            .context("the hub did not start")
    })?;
    let url = hub.url("everything").context("the hub serves HTTP")?;
    let script = dir.path().join("pi_calls.mjs");
    std::fs::write(&script, SCRIPT).context("cannot write the client's script")?;
    let mut relay = vec![path_str(&options.bin)?.to_owned()];
    relay.extend(hub::pi_config::relay_args(&socket, "everything"));
    let config = json!({
        "piMcp": format!("file://{}", path_str(&pi_mcp)?),
        "node": path_str(&peers.node)?,
        "everything": path_str(&peers.everything)?,
        "relay": relay,
        "url": url,
        "token": TOKEN,
        "warmUp": options.warm_up,
        "calls": options.calls,
    });
    // The client runs while the hub goes on on the runtime's own worker.
    let output = std::process::Command::new(&peers.node)
        .arg(&script)
        .arg(config.to_string())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir.path())
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run pi's client")?;
    runtime.block_on(async {
        let _ = tokio::time::timeout(Duration::from_secs(10), hub.shutdown()).await;
    });
    ensure!(
        output.status.success(),
        "pi's client failed ({}); see above",
        output.status
    );
    let times: Value =
        serde_json::from_slice(&output.stdout).context("pi's client printed no figures")?;
    let way = |name: &str| -> anyhow::Result<Vec<f64>> {
        let list = times[name]
            .as_array()
            .with_context(|| format!("no {name} figures"))?;
        Ok(list.iter().filter_map(Value::as_f64).collect())
    };
    let (direct, relay, http) = (way("direct")?, way("relay")?, way("http")?);
    ensure!(
        direct.len() == options.calls as usize
            && relay.len() == direct.len()
            && http.len() == direct.len(),
        "pi's client kept {} / {} / {} calls, not {}",
        direct.len(),
        relay.len(),
        http.len(),
        options.calls
    );
    let added = |through: &[f64]| {
        let paired: Vec<f64> = through.iter().zip(&direct).map(|(t, d)| t - d).collect();
        median(&paired)
    };
    Ok(PiCallFigures {
        calls: options.calls,
        relay_added_p50: added(&relay),
        http_added_p50: added(&http),
        direct: Latency::of(direct),
        relay: Latency::of(relay),
        http: Latency::of(http),
    })
}
