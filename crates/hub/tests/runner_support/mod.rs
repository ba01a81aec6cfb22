//! Shared by `runner_faults`: job files written as the worker writes them, the runner's environment,
//! `connect_all` bounded and unpacked, processes found by a marker in their environment, and a small
//! hand-written MCP server over HTTP whose later requests are answered 401.

#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hub::connect_all::{Connected, connect_all};
use hub::job_file::Stop;
use hub::plan::{Plan, plan};
use protocol::exit_line::ServerState;
use protocol::job_mcp::JobMcpFile;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// No test of the runner takes longer than this.
pub const TEST_BOUND: Duration = Duration::from_secs(60);

/// Runs `test` under [`TEST_BOUND`].
pub async fn bounded<T>(test: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_BOUND, test)
        .await
        .expect("the test finishes within its bound")
}

pub use testkit::{node, node_modules};

pub mod pi;

/// The job file the worker writes for `entries` (name, overlay entry), with its digest.
pub fn job_file(entries: &[(&str, Value)]) -> JobMcpFile {
    let entries: Vec<(String, config::json::Json)> = entries
        .iter()
        .map(|(n, e)| {
            (
                (*n).to_owned(),
                config::json::parse(&e.to_string()).unwrap(),
            )
        })
        .collect();
    JobMcpFile::new(&entries, None, true)
}

/// The runner's own environment: `PATH` and `HOME`, then `extra`.
pub fn runner_env(home: &Path, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = vec![
        ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
        ("HOME".to_owned(), home.to_str().unwrap().to_owned()),
    ];
    for (k, v) in extra {
        env.retain(|(name, _)| name != k);
        env.push(((*k).to_owned(), (*v).to_owned()));
    }
    env
}

/// The plan for `file`, read with `env` as the runner reads its own environment.
pub fn plan_with(file: &JobMcpFile, env: &[(String, String)]) -> Result<Plan, Stop> {
    let lookup = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    plan(file.text.as_bytes(), Some(&file.digest), &lookup)
}

/// How `connect_all` ended, and after how long.
pub enum Ended {
    Connected(Connected, Duration),
    Stopped(Stop, Vec<ServerState>, Duration),
}

impl Ended {
    /// The stop and the states, or a panic naming the servers that connected.
    pub fn stopped(self) -> (Stop, Vec<ServerState>, Duration) {
        match self {
            Ended::Stopped(stop, states, after) => (stop, states, after),
            Ended::Connected(c, after) => panic!(
                "connected after {after:?} instead of stopping: {:?}",
                c.states
            ),
        }
    }

    pub async fn connected(self) -> (Connected, Duration) {
        match self {
            Ended::Connected(c, after) => (c, after),
            Ended::Stopped(stop, states, after) => {
                panic!("stopped after {after:?}: {stop:?} {states:?}")
            }
        }
    }
}

/// Plans `file` with `env` and connects every server under `wait`, in a scratch workspace.
pub async fn connect(file: &JobMcpFile, env: &[(String, String)], wait: Duration) -> Ended {
    let plan = plan_with(file, env).unwrap_or_else(|stop| panic!("the plan is refused: {stop:?}"));
    let workspace = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let result = connect_all(plan, env, workspace.path(), wait).await;
    let after = started.elapsed();
    match result {
        Ok(c) => Ended::Connected(c, after),
        Err((stop, states)) => Ended::Stopped(stop, states, after),
    }
}

/// Shuts every connected server down.
pub async fn shut_down(connected: Connected) {
    for (upstream, _) in connected.upstreams {
        upstream.shutdown().await;
    }
}

/// Asserts that nothing the runner says about a stop holds any of `canaries`: the stop's cause, its
/// `Display` and `Debug`, and the states.
pub fn assert_says_no_secret(stop: &Stop, states: &[ServerState], canaries: &[&str]) {
    let said = format!("{} | {stop} | {stop:?} | {states:?}", stop.cause);
    for canary in canaries {
        assert!(!said.contains(canary), "{canary} in: {said}");
    }
}

/// The one state of server `name`.
pub fn state_of<'a>(states: &'a [ServerState], name: &str) -> &'a ServerState {
    states
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no state for {name}: {states:?}"))
}

pub use testkit::processes_with;

/// Polls until no live process holds `marker`, for at most `bound`; returns what is left.
pub async fn wait_gone(marker: &str, bound: Duration) -> Vec<(u32, String)> {
    let until = Instant::now() + bound;
    loop {
        let left = processes_with(marker);
        if left.is_empty() || Instant::now() >= until {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A unique marker for one test's processes.
pub fn marker(what: &str) -> String {
    format!("MARK-{what}-{}-{:?}", std::process::id(), Instant::now())
        .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "")
}

/// An MCP server over HTTP that answers `initialize` and `tools/list` (one tool, `echo`; the hub
/// asks for the list again when the agent does) and every other request with an id (`tools/call`)
/// with HTTP 401, as a server whose token was revoked mid-job does.
pub struct ExpiringServer {
    pub addr: SocketAddr,
    /// The JSON-RPC methods (or `GET`/`DELETE`) of every request, and the status answered.
    pub seen: Arc<Mutex<Vec<(String, u16)>>>,
    pub refused: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for ExpiringServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ExpiringServer {
    pub async fn start() -> ExpiringServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<(String, u16)>>> = Arc::default();
        let refused = Arc::new(AtomicUsize::new(0));
        let (s, r) = (seen.clone(), refused.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (s, r) = (s.clone(), r.clone());
                tokio::spawn(async move {
                    let _ = expiring_one(stream, &s, &r).await;
                });
            }
        });
        ExpiringServer {
            addr,
            seen,
            refused,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    pub fn seen(&self) -> Vec<(String, u16)> {
        self.seen.lock().unwrap().clone()
    }
}

/// One request: read it, answer it, close.
async fn expiring_one(
    stream: TcpStream,
    seen: &Mutex<Vec<(String, u16)>>,
    refused: &AtomicUsize,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let method = line
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).await? == 0 {
            return Ok(());
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':')
            && n.trim().eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    let mut stream = reader.into_inner();
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let rpc = request
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or(method.as_str())
        .to_owned();
    let id = request.get("id").cloned();
    let (status, content_type, answer) = match (method.as_str(), rpc.as_str(), id) {
        ("GET", ..) => (405, "text/plain", String::new()),
        ("DELETE", ..) => (200, "text/plain", String::new()),
        (_, _, None) => (202, "text/plain", String::new()),
        (_, "initialize", Some(id)) => (
            200,
            "application/json",
            json!({"jsonrpc": "2.0", "id": id, "result": {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "expiring", "version": "1.0.0"}
            }})
            .to_string(),
        ),
        (_, "tools/list", Some(id)) => (
            200,
            "application/json",
            json!({"jsonrpc": "2.0", "id": id, "result": {"tools": [{
                "name": "echo",
                "description": "Echoes its message",
                "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}}
            }]}})
            .to_string(),
        ),
        _ => {
            refused.fetch_add(1, Ordering::SeqCst);
            (
                401,
                "application/json",
                r#"{"error":"token revoked"}"#.to_owned(),
            )
        }
    };
    seen.lock().unwrap().push((rpc, status));
    let reason = match status {
        200 => "OK",
        202 => "Accepted",
        401 => "Unauthorized",
        _ => "Method Not Allowed",
    };
    let auth = if status == 401 {
        "WWW-Authenticate: Bearer realm=\"mcp\"\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nMcp-Session-Id: s-1\r\n{auth}Connection: close\r\n\r\n",
        answer.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(answer.as_bytes()).await?;
    stream.flush().await?;
    let _ = stream.shutdown().await;
    Ok(())
}
