//! The MCP conformance suite (`@modelcontextprotocol/conformance`, from the workspace's
//! node_modules) against the hub, both ways:
//!
//! - server side: `conformance server --suite all` against server-everything directly, and through
//!   hub endpoints fronting it (its streamable-HTTP process, and a stdio one), side by side; every
//!   scenario that passes directly must pass through the hub. The suite cannot send a header of its
//!   own, so it reaches the hub through a loopback pass-through that adds the hub's
//!   `Authorization: Bearer` (a control run sends the direct traffic through the same pass-through);
//! - client side: `conformance client --scenario <name>` runs `hub-conformance-client` (the hub's
//!   own upstream client: `hub::http::transport` and `connect_transport`) against the suite's test
//!   servers, for `initialize`, `tools_call` and `sse-retry`, which must pass.
//!
//! Every process started here is bounded in time and killed with its process group; all traffic
//! stays on 127.0.0.1. The results are written up in docs/conformance.md.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod http_support;
mod relay_support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::header::{AUTHORIZATION, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hub::connect::connect_transport;
use hub::http::{HttpPolicy, transport};
use hub::relay::{UpstreamEvents, Withheld, serve};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use relay_support::{node, node_modules};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::task::{JoinHandle, JoinSet};

/// One suite run (every server scenario, or one client scenario) may take this long.
const RUN_BOUND: Duration = Duration::from_secs(300);

/// The two tests take turns: the suite's `sse-retry` measures the client's timing, and the machine
/// may have two cores only.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The suite's command line, from its package.json `bin`.
fn conformance() -> PathBuf {
    let package = node_modules().join("@modelcontextprotocol/conformance");
    let manifest = std::fs::read_to_string(package.join("package.json")).unwrap_or_else(|e| {
        panic!(
            "{} is missing ({e}): install the project's node_modules (npm install)",
            package.display()
        )
    });
    let manifest: Value = serde_json::from_str(&manifest).unwrap();
    let bin = manifest["bin"]["conformance"]
        .as_str()
        .expect("the suite names its bin");
    let entry = package.join(bin);
    assert!(entry.is_file(), "{} is missing", entry.display());
    entry
}

/// A process started in a group of its own, the whole group killed when this is dropped.
struct Group {
    child: Child,
    pgid: Option<i32>,
}

impl Group {
    fn spawn(mut command: Command) -> Group {
        command.process_group(0).kill_on_drop(true);
        let child = command.spawn().expect("the process starts");
        let pgid = child.id().and_then(|pid| i32::try_from(pid).ok());
        Group { child, pgid }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            spawn::signal::group(pgid.cast_unsigned(), spawn::signal::End::Kill);
        }
        let _ = self.child.start_kill();
    }
}

/// A command with nothing of this process's environment but a PATH with node first and a HOME:
/// no proxy variables, so every request goes straight to 127.0.0.1.
fn command(program: &Path, home: &Path) -> Command {
    let mut command = Command::new(program);
    let node_dir = node().parent().unwrap().to_str().unwrap().to_owned();
    command
        .env_clear()
        .env("PATH", format!("{node_dir}:/usr/local/bin:/usr/bin:/bin"))
        .env("HOME", home)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    command
}

/// server-everything over streamable HTTP on a port of its own.
async fn start_everything_http(home: &Path) -> (Group, SocketAddr) {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut command = command(&node(), home);
    command
        .arg(relay_support::everything())
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut group = Group::spawn(command);
    let mut lines = BufReader::new(group.child.stderr.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("listening on port") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(ready, Ok(true), "server-everything did not start");
    // Keep draining its log so that it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (group, SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}

/// A loopback pass-through to `target` that adds `Authorization: Bearer <token>` to every request
/// and passes everything else as it came, `Host` and `Origin` included (the suite's DNS-rebinding
/// scenario sends its own), each response streamed back as it arrives.
struct PassThrough {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for PassThrough {
    fn drop(&mut self) {
        // Its connections go with it (they are in the task's JoinSet).
        self.task.abort();
    }
}

type ProxyBody = UnsyncBoxBody<Bytes, std::io::Error>;

/// Hop-by-hop headers, and the length, which the pass-through's own connections set.
const NOT_PASSED: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

impl PassThrough {
    async fn start(target: SocketAddr, token: &str) -> PassThrough {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let authorization = HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let (client, authorization) = (client.clone(), authorization.clone());
                        let service = hyper::service::service_fn(move |request| {
                            pass(client.clone(), target, authorization.clone(), request)
                        });
                        connections.spawn(async move {
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        PassThrough { addr, task }
    }
}

fn bare(status: StatusCode) -> Response<ProxyBody> {
    let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed_unsync());
    *response.status_mut() = status;
    response
}

async fn pass(
    client: reqwest::Client,
    target: SocketAddr,
    authorization: HeaderValue,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let url = format!("http://{target}{path}");
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return Ok(bare(StatusCode::BAD_REQUEST));
    };
    let mut headers = parts.headers;
    for name in NOT_PASSED {
        headers.remove(name);
    }
    headers.insert(AUTHORIZATION, authorization);
    let mut forwarded = client.request(parts.method, url).headers(headers);
    if !body.is_empty() {
        forwarded = forwarded.body(body);
    }
    let Ok(upstream) = forwarded.send().await else {
        return Ok(bare(StatusCode::BAD_GATEWAY));
    };
    let mut response = Response::builder().status(upstream.status());
    for (name, value) in upstream.headers() {
        if !NOT_PASSED.contains(&name.as_str()) {
            response = response.header(name, value);
        }
    }
    let body = upstream
        .bytes_stream()
        .map(|chunk| chunk.map(Frame::data).map_err(std::io::Error::other));
    Ok(response
        .body(StreamBody::new(body).boxed_unsync())
        .unwrap_or_else(|_| bare(StatusCode::BAD_GATEWAY)))
}

/// One scenario's outcome, read from its `checks.json`.
#[derive(Debug, Clone)]
struct Outcome {
    success: usize,
    failure: usize,
    warning: usize,
    /// The first failed check: its id and message.
    first_failure: Option<String>,
    /// Every check but the INFO ones: status, id and message.
    notable: Vec<String>,
    /// A check rests on a tool the server does not have, answered as an `isError` result ("Tool …
    /// not found"): the answer server-everything gives a tool it lacks, which is all that
    /// `tools-call-simple-text` and `tools-call-error` check.
    missing_tool_result: bool,
}

impl Outcome {
    /// As the suite's summary has it: a scenario passes with checks and none failed.
    fn passed(&self) -> bool {
        self.failure == 0 && self.success + self.warning > 0
    }

    /// Passed, but only on the answer to a tool the server does not have.
    fn passed_vacuously(&self) -> bool {
        self.passed() && self.missing_tool_result
    }

    fn cell(&self) -> String {
        if self.passed_vacuously() {
            "pass (missing tool)".to_owned()
        } else if self.passed() {
            "pass".to_owned()
        } else {
            format!("FAIL ({}/{})", self.failure, self.success + self.failure)
        }
    }

    fn read(checks: &Path) -> Outcome {
        let text =
            std::fs::read_to_string(checks).unwrap_or_else(|e| panic!("{}: {e}", checks.display()));
        let checks: Vec<Value> = serde_json::from_str(&text).unwrap();
        let count = |status: &str| checks.iter().filter(|c| c["status"] == status).count();
        let line = |c: &Value| {
            let message = c["errorMessage"].as_str().unwrap_or_default();
            let message: String = message.chars().take(160).collect();
            format!("{}: {message}", c["id"].as_str().unwrap_or("?"))
        };
        let first_failure = checks.iter().find(|c| c["status"] == "FAILURE").map(line);
        let notable = checks
            .iter()
            .filter(|c| c["status"] != "INFO")
            .map(|c| format!("{} {}", c["status"].as_str().unwrap_or("?"), line(c)))
            .collect();
        let missing_tool_result = checks.iter().any(|c| {
            let result = &c["details"]["result"];
            result["isError"] == true
                && result["content"][0]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("Tool ") && t.contains(" not found"))
        });
        Outcome {
            success: count("SUCCESS"),
            failure: count("FAILURE"),
            warning: count("WARNING"),
            first_failure,
            notable,
            missing_tool_result,
        }
    }
}

/// Runs the suite with `args` (and `-o <dir>`), bounded; returns its exit status and output.
async fn run_suite(args: &[&str], out: &Path, home: &Path) -> (std::process::ExitStatus, String) {
    let mut command = command(&node(), home);
    command
        .arg(conformance())
        .args(args)
        .arg("-o")
        .arg(out)
        .current_dir(home)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut group = Group::spawn(command);
    let stdout = group.child.stdout.take().unwrap();
    let stderr = group.child.stderr.take().unwrap();
    let read = |pipe: Box<dyn tokio::io::AsyncRead + Unpin + Send>| {
        tokio::spawn(async move {
            let mut text = String::new();
            let mut lines = BufReader::new(pipe).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                text.push_str(&line);
                text.push('\n');
            }
            text
        })
    };
    let (stdout, stderr) = (read(Box::new(stdout)), read(Box::new(stderr)));
    let status = tokio::time::timeout(RUN_BOUND, group.child.wait())
        .await
        .unwrap_or_else(|_| panic!("conformance {args:?} did not end within {RUN_BOUND:?}"))
        .unwrap();
    drop(group); // anything it left in its group
    let drained = |reader: JoinHandle<String>| async move {
        tokio::time::timeout(Duration::from_secs(10), reader)
            .await
            .map_or_else(|_| "(output not closed)\n".to_owned(), Result::unwrap)
    };
    let output = format!("{}{}", drained(stdout).await, drained(stderr).await);
    (status, output)
}

/// `conformance server --suite all` against `url`: each scenario's outcome, by name.
async fn server_suite(label: &str, url: &str, home: &Path) -> BTreeMap<String, Outcome> {
    let out = home.join(format!("server-{label}"));
    let (_, output) = run_suite(&["server", "--url", url, "--suite", "all"], &out, home).await;
    let mut outcomes = BTreeMap::new();
    for entry in std::fs::read_dir(&out).unwrap().flatten() {
        let dir = entry.file_name().to_str().unwrap().to_owned();
        // `server-<scenario>-<timestamp>`, the timestamp as `2026-01-31T00-00-00-000Z`.
        let name = dir
            .strip_prefix("server-")
            .and_then(|rest| {
                rest.get(..rest.len().saturating_sub("-2026-01-31T00-00-00-000Z".len()))
            })
            .unwrap_or_else(|| panic!("unexpected result directory {dir}"));
        outcomes.insert(
            name.to_owned(),
            Outcome::read(&entry.path().join("checks.json")),
        );
    }
    assert!(
        outcomes.len() >= 30,
        "{label}: only {} scenarios ran:\n{output}",
        outcomes.len()
    );
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_server_scenario_passing_against_server_everything_passes_through_the_hub() {
    let _turn = SERIAL.lock().await;
    let home = tempfile::tempdir().unwrap();
    let (_everything, everything) = start_everything_http(home.path()).await;
    let direct = format!("http://{everything}/mcp");

    // The hub fronts server-everything twice: its HTTP process, reached as the job reaches an HTTP
    // server (an mcp.json entry resolved, the job's transport), and a stdio process of its own.
    let (url, headers) = http_support::resolved(&direct, &[], &[]);
    let http = transport(&url, &headers, &HttpPolicy::default()).unwrap();
    let over_http = tokio::time::timeout(
        Duration::from_secs(60),
        connect_transport("everything-http", http.transport, UpstreamEvents::new()),
    )
    .await
    .expect("bounded")
    .expect("the hub connects to server-everything over HTTP");
    let over_stdio =
        relay_support::start_everything("everything-stdio", UpstreamEvents::new(), home.path())
            .await;
    let token = "conformance-token-7f3a";
    let hub = serve(
        vec![
            (over_http, Withheld::none()),
            (over_stdio, Withheld::none()),
        ],
        token.to_owned(),
    )
    .await
    .unwrap();
    let to_hub = PassThrough::start(hub.addr().unwrap(), token).await;
    let to_everything = PassThrough::start(everything, token).await;

    let columns = [
        ("direct", direct.clone()),
        (
            "direct via pass-through",
            format!("http://{}/mcp", to_everything.addr),
        ),
        (
            "hub, HTTP upstream",
            format!("http://{}/mcp/everything-http", to_hub.addr),
        ),
        (
            "hub, stdio upstream",
            format!("http://{}/mcp/everything-stdio", to_hub.addr),
        ),
    ];
    let mut results = Vec::new();
    for (label, url) in &columns {
        let slug = label.replace([' ', ','], "-");
        results.push(server_suite(&slug, url, home.path()).await);
    }
    tokio::time::timeout(Duration::from_secs(20), hub.shutdown())
        .await
        .expect("the hub shuts down");

    // The table.
    let names: Vec<&String> = results[0].keys().collect();
    let width = names.iter().map(|n| n.len()).max().unwrap_or(8);
    let mut table = format!("{:width$}", "scenario");
    for (label, _) in &columns {
        table.push_str(&format!(" | {label:23}"));
    }
    table.push('\n');
    for name in &names {
        table.push_str(&format!("{name:width$}"));
        for result in &results {
            let cell = result
                .get(*name)
                .map_or("(not run)".to_owned(), Outcome::cell);
            table.push_str(&format!(" | {cell:23}"));
        }
        table.push('\n');
    }
    println!("{table}");
    // What the checks said, for each scenario whose outcome is not the same in every column.
    for name in &names {
        let cells: Vec<String> = results
            .iter()
            .map(|r| r.get(*name).map_or(String::new(), Outcome::cell))
            .collect();
        if cells.iter().all(|c| *c == cells[0]) {
            continue;
        }
        println!("{name}:");
        for ((label, _), result) in columns.iter().zip(&results) {
            if let Some(outcome) = result.get(*name) {
                println!("  {label}: {}", outcome.notable.join("; "));
            }
        }
    }

    // Every scenario that passes directly passes through the pass-through and the hub. A scenario
    // that passes directly only on server-everything's answer to a tool it lacks (an `isError`
    // result, "Tool … not found") may instead meet the hub's refusal of that call (JSON-RPC error
    // -32602, "unknown tool: the server did not list it"), which the spec prescribes for an
    // unknown tool; docs/conformance.md says so.
    let mut regressions = Vec::new();
    for (name, outcome) in &results[0] {
        if !outcome.passed() {
            continue;
        }
        for ((label, _), result) in columns.iter().zip(&results).skip(1) {
            match result.get(name) {
                Some(o) if o.passed() => {}
                Some(o)
                    if outcome.passed_vacuously()
                        && label.starts_with("hub")
                        && o.first_failure
                            .as_deref()
                            .is_some_and(|f| f.contains("the server did not list it")) => {}
                Some(o) => regressions.push(format!(
                    "{name}, {label}: {}",
                    o.first_failure.clone().unwrap_or_default()
                )),
                None => regressions.push(format!("{name}, {label}: not run")),
            }
        }
    }
    let passed_directly = results[0].values().filter(|o| o.passed()).count();
    assert!(passed_directly > 0, "nothing passed directly:\n{table}");
    assert!(
        regressions.is_empty(),
        "passed directly but not through the hub:\n{}\n\n{table}",
        regressions.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hubs_client_passes_the_client_scenarios() {
    let _turn = SERIAL.lock().await;
    let home = tempfile::tempdir().unwrap();
    let client = env!("CARGO_BIN_EXE_hub-conformance-client");
    assert!(
        !client.contains(' '),
        "the suite splits its --command on spaces: {client}"
    );
    let mut failed = Vec::new();
    for scenario in ["initialize", "tools_call", "sse-retry"] {
        let out = home.path().join(format!("client-{scenario}"));
        let (status, output) = run_suite(
            &[
                "client",
                "--command",
                client,
                "--scenario",
                scenario,
                "--timeout",
                "30000",
            ],
            &out,
            home.path(),
        )
        .await;
        let dir = std::fs::read_dir(&out)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_str().unwrap().starts_with(scenario))
            .unwrap_or_else(|| panic!("{scenario}: no results\n{output}"));
        let checks: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("checks.json")).unwrap())
                .unwrap();
        println!("== {scenario} (suite exit {status})");
        for check in &checks {
            let status = check["status"].as_str().unwrap_or("?");
            if status != "INFO" {
                let message = check["errorMessage"].as_str().unwrap_or_default();
                let details = &check["details"];
                let extra = match (&details["actualDelayMs"], &details["lastEventIds"]) {
                    (Value::Number(ms), _) => format!("(reconnected after {ms} ms)"),
                    (_, Value::Array(ids)) => format!("(Last-Event-ID sent: {ids:?})"),
                    _ => String::new(),
                };
                println!(
                    "  {status:8} {} {message}{extra}",
                    check["id"].as_str().unwrap_or("?")
                );
            }
        }
        let said = std::fs::read_to_string(dir.path().join("stdout.txt")).unwrap_or_default();
        for line in said.lines() {
            println!("  client: {line}");
        }
        let outcome = Outcome::read(&dir.path().join("checks.json"));
        // As the suite judges a client: no failure, no warning, and the client exited 0.
        if !status.success() || outcome.failure > 0 || outcome.warning > 0 || outcome.success == 0 {
            let client_err =
                std::fs::read_to_string(dir.path().join("stderr.txt")).unwrap_or_default();
            failed.push(format!(
                "{scenario}: {outcome:?}\n{output}\nclient stderr:\n{client_err}"
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
