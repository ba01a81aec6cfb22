//! The runner's connections under faults, end to end through the job file: each case is a job file as
//! the worker writes it, planned with the runner's environment, connected with `connect_all` under a
//! short wait, and the stop checked against the spec's table ("In the job"): its reason and code,
//! the failing server's state, and a cause that holds no value of the job's (canaries in headers,
//! the URL's path and query, a stdio server's arguments and env). Then a whole job whose server
//! answers 401 mid-job.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod http_support;
mod runner_support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use http_support::{FaultServer, GIB, memory};
use hub::job::{JobOptions, run};
use protocol::reason::Reason;
use runner_support::*;
use serde_json::{Value, json};

const TOKEN: &str = "cnry-hdr-tok-7f3";
const API_KEY: &str = "cnry-hdr-key-2a9";
const PATH_KEY: &str = "cnry-path-c41";
const QUERY_KEY: &str = "cnry-query-e88";
const ARG_TOKEN: &str = "cnry-arg-5d0";
const SERVER_KEY: &str = "cnry-env-91b";
const CANARIES: [&str; 7] = [
    TOKEN, API_KEY, PATH_KEY, QUERY_KEY, ARG_TOKEN, SERVER_KEY, "cnry",
];

/// How long after `connect_all` returns a server it aborted may still be alive (the product bug
/// `connect_all_returns_only_once_its_servers_are_killed` shows: it is killed when the runtime gets
/// to the aborted task, usually within a millisecond).
const KILL_GRACE: Duration = Duration::from_secs(1);

/// The wait the runner is given in these tests: short, so that a case that waits it out is quick.
const WAIT: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// HTTP servers

/// An overlay entry for `kind` on the fault server at `base`, with a credential in two headers, in
/// the URL's path and in its query.
fn http_entry(base: &str, kind: &str, timeout: Option<u16>) -> Value {
    let mut entry = json!({
        "url": format!("{base}/k/${{PATH_KEY}}/{kind}?api_key=${{QUERY_KEY}}"),
        "headers": {"Authorization": "Bearer ${TOKEN}", "X-Api-Key": "${API_KEY}"},
        "description": "A server that misbehaves on purpose",
    });
    if let Some(t) = timeout {
        entry["timeout"] = t.into();
    }
    entry
}

fn http_env(home: &std::path::Path) -> Vec<(String, String)> {
    runner_env(
        home,
        &[
            ("TOKEN", TOKEN),
            ("API_KEY", API_KEY),
            ("PATH_KEY", PATH_KEY),
            ("QUERY_KEY", QUERY_KEY),
        ],
    )
}

/// Connects one server, `fault`, of `kind` on `server` under `wait`.
async fn connect_http(
    server: &FaultServer,
    kind: &str,
    timeout: Option<u16>,
    wait: Duration,
) -> Ended {
    let home = tempfile::tempdir().unwrap();
    let file = job_file(&[("fault", http_entry(&server.base(), kind, timeout))]);
    connect(&file, &http_env(home.path()), wait).await
}

/// The server really was sent every credential: the canaries were there to leak.
fn assert_credentials_sent(server: &FaultServer) {
    let seen = server.seen();
    assert!(!seen.is_empty(), "the server saw no request");
    for s in &seen {
        assert_eq!(
            s.header("authorization"),
            Some(&*format!("Bearer {TOKEN}")),
            "{s:?}"
        );
        assert_eq!(s.header("x-api-key"), Some(API_KEY), "{s:?}");
        assert!(
            s.target.contains(PATH_KEY) && s.target.contains(&format!("api_key={QUERY_KEY}")),
            "{s:?}"
        );
    }
}

/// Asserts a stop of server `fault` with `reason`, its state `state`, and no value in what is said.
fn assert_stop(
    stop: &hub::job_file::Stop,
    states: &[protocol::exit_line::ServerState],
    reason: Reason,
    state: &str,
) {
    assert_eq!(stop.reason, reason, "{stop:?}");
    assert_eq!(stop.server.as_deref(), Some("fault"), "{stop:?}");
    assert_eq!(state_of(states, "fault").state, state, "{states:?}");
    assert_eq!(state_of(states, "fault").ready_ms, None, "{states:?}");
    assert_says_no_secret(stop, states, &CANARIES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_refused_not_followed() {
    bounded(async {
        let server = FaultServer::start().await;
        let (stop, states, after) = connect_http(&server, "redirect", None, WAIT)
            .await
            .stopped();
        assert_stop(&stop, &states, Reason::McpUnavailable, "failed");
        assert_eq!(stop.reason.code(), Some(2));
        assert!(
            stop.cause.contains("302") && stop.cause.contains("redirect"),
            "{}",
            stop.cause
        );
        assert!(
            after < WAIT,
            "refused at once, not after the wait: {after:?}"
        );
        assert!(
            server.seen().iter().all(|s| s.kind != "followed"),
            "the redirect was followed"
        );
        assert_eq!(server.seen().len(), 1, "not retried: {:?}", server.seen());
        assert_credentials_sent(&server);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_at_the_start_is_unavailable() {
    bounded(async {
        let server = FaultServer::start().await;
        let (stop, states, after) = connect_http(&server, "unauthorized", None, WAIT)
            .await
            .stopped();
        assert_stop(&stop, &states, Reason::McpUnavailable, "failed");
        assert_eq!(stop.reason.code(), Some(2));
        assert!(stop.cause.contains("HTTP 401"), "{}", stop.cause);
        assert!(after < WAIT, "{after:?}");
        assert_eq!(
            server.seen().len(),
            1,
            "a job never signs in, nor asks again"
        );
        assert_credentials_sent(&server);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_403_and_a_501_are_unavailable() {
    bounded(async {
        for code in ["403", "501"] {
            let server = FaultServer::start().await;
            let kind = format!("status-{code}");
            let (stop, states, after) = connect_http(&server, &kind, None, WAIT).await.stopped();
            assert_stop(&stop, &states, Reason::McpUnavailable, "failed");
            assert_eq!(stop.reason.code(), Some(2));
            assert!(
                stop.cause.contains(&format!("HTTP {code}")),
                "{}",
                stop.cause
            );
            assert!(after < WAIT, "{code}: {after:?}");
            assert_eq!(server.seen().len(), 1, "{code} is an answer, not retried");
            assert_credentials_sent(&server);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_then_an_answer_connects() {
    bounded(async {
        let server = FaultServer::start().await;
        let (connected, _) = connect_http(&server, "flaky", None, Duration::from_secs(5))
            .await
            .connected()
            .await;
        let state = state_of(&connected.states, "fault");
        assert_eq!(state.state, "ready");
        assert!(state.ready_ms.is_some());
        assert_eq!(connected.upstreams.len(), 1);
        assert_eq!(connected.upstreams[0].0.tools[0].name, "echo");
        assert_eq!(
            connected.monitors.len(),
            1,
            "the HTTP server is watched for a 401"
        );
        let initialize: Vec<_> = server
            .seen()
            .into_iter()
            .filter(|s| s.rpc_method().as_deref() == Some("initialize"))
            .collect();
        assert_eq!(
            initialize.len(),
            2,
            "one 500, then asked again: {initialize:?}"
        );
        assert!(server.state.flaky_hits.load(Ordering::SeqCst) >= 3);
        assert_credentials_sent(&server);
        shut_down(connected).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_until_the_wait_ends_is_unreachable() {
    bounded(async {
        let server = FaultServer::start().await;
        let (stop, states, after) = connect_http(&server, "status-429", None, WAIT)
            .await
            .stopped();
        assert_stop(&stop, &states, Reason::McpUnreachable, "waiting");
        assert_eq!(stop.reason.code(), Some(1));
        assert!(
            stop.cause.contains("429"),
            "the last retried failure is said: {}",
            stop.cause
        );
        assert!(
            after >= WAIT && after < WAIT + Duration::from_secs(2),
            "{after:?}"
        );
        // Asked again with growing pauses (0.25, 0.5, 1 s...): several times within 2 s.
        let asked = server.seen().len();
        assert!(asked >= 3, "retried only {asked} times");
        assert_credentials_sent(&server);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_gib_body_is_unavailable_without_the_runner_growing() {
    bounded(async {
        let (rss_before, _) = memory();
        let server = FaultServer::start().await;
        let (stop, states, _) = connect_http(&server, "huge-json", None, Duration::from_secs(10))
            .await
            .stopped();
        assert_stop(&stop, &states, Reason::McpUnavailable, "failed");
        assert_eq!(stop.reason.code(), Some(2));
        assert!(stop.cause.contains("over 16777216 bytes"), "{}", stop.cause);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let written = server.huge_written();
        assert!(
            written < 64 * 1024 * 1024,
            "the server wrote {written} of {GIB} bytes"
        );
        let (_, peak) = memory();
        let grown = peak.saturating_sub(rss_before);
        eprintln!("RSS before {rss_before} bytes, peak {peak} bytes, server wrote {written} bytes");
        assert!(
            peak < 512 * 1024 * 1024 && grown < 256 * 1024 * 1024,
            "peak {peak} bytes, grown by {grown} bytes for a body of {GIB}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_slower_than_the_wait_is_unreachable() {
    bounded(async {
        let server = FaultServer::start().await;
        let (stop, states, after) = connect_http(&server, "hang", None, WAIT).await.stopped();
        assert_stop(&stop, &states, Reason::McpUnreachable, "waiting");
        assert_eq!(stop.reason.code(), Some(1));
        assert!(stop.cause.contains("wait of 2 s"), "{}", stop.cause);
        assert!(
            after >= WAIT && after < WAIT + Duration::from_secs(2),
            "{after:?}"
        );
        assert_eq!(server.seen().len(), 1);
        assert_credentials_sent(&server);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_past_its_own_timeout_is_unavailable() {
    bounded(async {
        let server = FaultServer::start().await;
        let wait = Duration::from_secs(3);
        let (stop, states, after) = connect_http(&server, "hang", Some(1), wait).await.stopped();
        assert_stop(&stop, &states, Reason::McpUnavailable, "failed");
        assert_eq!(stop.reason.code(), Some(2));
        assert!(stop.cause.contains("own timeout of 1 s"), "{}", stop.cause);
        assert!(after >= Duration::from_secs(1) && after < wait, "{after:?}");
        assert_credentials_sent(&server);
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// stdio servers

/// A stdio server: `sh -c script`, with a credential as `$0` and in its env, and `MARK` (the
/// test's marker) in its env to find its processes by.
fn sh_entry(script: &str) -> Value {
    json!({
        "command": "sh",
        "args": ["-c", script, "--token=${ARG_TOKEN}"],
        "env": {"MARK": "${MARK}", "SERVER_KEY": "${SERVER_KEY}"},
        "description": "A shell that is no MCP server",
    })
}

fn sh_env(home: &std::path::Path, marker: &str) -> Vec<(String, String)> {
    runner_env(
        home,
        &[
            ("MARK", marker),
            ("ARG_TOKEN", ARG_TOKEN),
            ("SERVER_KEY", SERVER_KEY),
        ],
    )
}

/// Connects `sh -c script` as server `fault` under `wait`, and says which of its processes were
/// alive half-way through the wait.
async fn connect_sh(script: &str, wait: Duration, marker: &str) -> (Ended, Vec<(u32, String)>) {
    let home = tempfile::tempdir().unwrap();
    let file = job_file(&[("fault", sh_entry(script))]);
    let env = sh_env(home.path(), marker);
    let probe = async {
        tokio::time::sleep(wait / 2).await;
        processes_with(marker)
    };
    tokio::join!(connect(&file, &env, wait), probe)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_that_hangs_is_unreachable_and_killed() {
    bounded(async {
        let marker = marker("hang");
        let (ended, during) = connect_sh("sleep 30", WAIT, &marker).await;
        // Within KILL_GRACE, not at once: see `connect_all_returns_only_once_its_servers_are_killed`.
        let left = wait_gone(&marker, KILL_GRACE).await;
        let (stop, states, after) = ended.stopped();
        assert!(
            !during.is_empty(),
            "the server was not running during the wait"
        );
        assert!(
            left.is_empty(),
            "left running after connect_all returned: {left:?} (during: {during:?})"
        );
        assert_stop(&stop, &states, Reason::McpUnreachable, "waiting");
        assert_eq!(stop.reason.code(), Some(1));
        assert!(
            after >= WAIT && after < WAIT + Duration::from_secs(2),
            "{after:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_that_exits_at_once_is_unavailable() {
    bounded(async {
        let marker = marker("exit");
        let (ended, _) = connect_sh("exit 3", WAIT, &marker).await;
        let (stop, states, after) = ended.stopped();
        assert_stop(&stop, &states, Reason::McpUnavailable, "failed");
        assert_eq!(stop.reason.code(), Some(2));
        assert!(stop.cause.contains("exited"), "{}", stop.cause);
        assert!(after < WAIT, "{after:?}");
    })
    .await;
}

/// `connect_all` aborts the connections still running when it stops (connect_all.rs, `tasks.abort_all()`)
/// and returns without waiting for them to end: a stdio server it was still connecting is killed only
/// once the runtime drops the aborted task, after `connect_all` has returned (and in the job, after
/// the exit line is made). Strictly, right after the return, its processes are sometimes still alive.
/// Checks right after the return that the abandoned server is gone (it once was not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_all_returns_only_once_its_servers_are_killed() {
    bounded(async {
        for round in 0..20 {
            let marker = marker(&format!("strict{round}"));
            let (ended, during) = connect_sh("sleep 30", Duration::from_millis(600), &marker).await;
            let left = processes_with(&marker);
            drop(ended);
            assert!(!during.is_empty(), "round {round}: the server never ran");
            assert!(
                left.is_empty(),
                "round {round}: still alive after connect_all returned: {left:?}"
            );
        }
    })
    .await;
}

/// A server that prints a line that is not JSON on stdout. The client ignores an unparsable line
/// (rmcp's stdio codec does, as the other official MCP SDKs do, pi's included), so the line alone
/// is no refusal: what decides is what the server does next. Said nothing more: it has not answered
/// when the wait runs out, `mcp-unreachable` (code 1, retried), not `mcp-unavailable`. Exited: it
/// is `mcp-unavailable`. Answered the handshake after the line: it connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_that_prints_garbage_is_judged_by_what_it_does_next() {
    bounded(async {
        let marker = marker("garbage");
        let (ended, during) = connect_sh("echo not-json; sleep 30", WAIT, &marker).await;
        let left = wait_gone(&marker, KILL_GRACE).await;
        let (stop, states, after) = ended.stopped();
        assert!(!during.is_empty(), "the server was not running during the wait");
        assert!(left.is_empty(), "left running: {left:?}");
        assert_stop(&stop, &states, Reason::McpUnreachable, "waiting");
        assert_eq!(stop.reason.code(), Some(1));
        assert!(
            stop.cause.contains("wait of 2 s"),
            "the garbage is not what stopped it: {}",
            stop.cause
        );
        assert!(after >= WAIT, "{after:?}");

        let (ended, _) = connect_sh("echo not-json; exit 0", WAIT, &marker).await;
        let (stop, states, after) = ended.stopped();
        assert_stop(&stop, &states, Reason::McpUnavailable, "failed");
        assert_eq!(stop.reason.code(), Some(2));
        assert!(stop.cause.contains("exited"), "{}", stop.cause);
        assert!(after < WAIT, "{after:?}");

        let answers = r#"echo not-json; read -r line; echo '{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"sh","version":"1"}}}'; sleep 30"#;
        let (ended, _) = connect_sh(answers, WAIT, &marker).await;
        let (connected, _) = ended.connected().await;
        assert_eq!(state_of(&connected.states, "fault").state, "ready");
        shut_down(connected).await;
        let left = wait_gone(&marker, Duration::from_secs(10)).await;
        assert!(left.is_empty(), "left running after shutdown: {left:?}");
    })
    .await;
}

/// One server connects, another then runs out its own timeout: the job stops, and the one that
/// connected is shut down with its whole process group before `connect_all` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_shuts_down_the_servers_already_connected() {
    bounded(async {
        let home = tempfile::tempdir().unwrap();
        let marker = marker("ready");
        let server = FaultServer::start().await;
        let everything =
            node_modules().join("@modelcontextprotocol/server-everything/dist/index.js");
        let node_bin = node().parent().unwrap().to_owned();
        let file = job_file(&[
            (
                "everything",
                json!({
                    "command": "node",
                    "args": [everything.to_str().unwrap(), "stdio"],
                    "env": {"MARK": "${MARK}"},
                    "description": "server-everything",
                }),
            ),
            ("fault", http_entry(&server.base(), "hang", Some(6))),
        ]);
        let mut env = http_env(home.path());
        env.retain(|(k, _)| k != "PATH");
        env.push((
            "PATH".to_owned(),
            format!("{}:/usr/bin:/bin", node_bin.display()),
        ));
        env.push(("MARK".to_owned(), marker.clone()));
        let (stop, states, _) = connect(&file, &env, Duration::from_secs(10))
            .await
            .stopped();
        // Shut down (awaited) inside connect_all: gone at once, no grace needed.
        let left = processes_with(&marker);
        assert_stop(&stop, &states, Reason::McpUnavailable, "failed");
        let ready = state_of(&states, "everything");
        assert_eq!(ready.state, "ready", "{states:?}");
        assert!(ready.ready_ms.is_some());
        assert!(
            left.is_empty(),
            "the connected server was left running: {left:?}"
        );
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// The plan

#[test]
fn the_plan_stops_on_a_missing_command_a_missing_variable_and_a_tampered_file() {
    let home = tempfile::tempdir().unwrap();
    let marker = marker("plan");
    let env = sh_env(home.path(), &marker);

    let missing_command = job_file(&[(
        "fault",
        json!({"command": "no-such-server-cnry", "args": ["--token=${ARG_TOKEN}"], "env": {"SERVER_KEY": "${SERVER_KEY}"}, "description": "d"}),
    )]);
    let stop = plan_with(&missing_command, &env).unwrap_err();
    assert_eq!(stop.reason, Reason::McpCommandMissing);
    assert_eq!(stop.server.as_deref(), Some("fault"));
    // The command's own name is written in the overlay, not a value: the cause may name it.
    assert!(stop.cause.contains("no-such-server-cnry"), "{}", stop.cause);
    for canary in [ARG_TOKEN, SERVER_KEY] {
        assert!(!format!("{stop} {stop:?}").contains(canary), "{stop:?}");
    }

    let mut unset = env.clone();
    unset.retain(|(k, _)| k != "SERVER_KEY");
    let stop = plan_with(&job_file(&[("fault", sh_entry("exit 0"))]), &unset).unwrap_err();
    assert_eq!(stop.reason, Reason::McpSecretMissing);
    assert_eq!(stop.server.as_deref(), Some("fault"));
    assert!(
        stop.cause.contains("SERVER_KEY"),
        "names the variable: {}",
        stop.cause
    );
    assert_says_no_secret(&stop, &[], &CANARIES);

    // An empty value is as good as none.
    let mut empty = env.clone();
    empty.retain(|(k, _)| k != "SERVER_KEY");
    empty.push(("SERVER_KEY".to_owned(), String::new()));
    let stop = plan_with(&job_file(&[("fault", sh_entry("exit 0"))]), &empty).unwrap_err();
    assert_eq!(stop.reason, Reason::McpSecretMissing);

    let mut tampered = job_file(&[("fault", sh_entry("exit 0"))]);
    tampered.text = tampered.text.replace("exit 0", "exit 1");
    let stop = plan_with(&tampered, &env).unwrap_err();
    assert_eq!(stop.reason, Reason::McpConfigMismatch);
    assert_eq!(stop.server, None);
    assert_says_no_secret(&stop, &[], &CANARIES);

    for reason in [
        Reason::McpCommandMissing,
        Reason::McpSecretMissing,
        Reason::McpConfigMismatch,
    ] {
        assert_eq!(reason.code(), Some(2), "{reason:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// A whole job

/// The agent: reads pi's mcp.json, starts a grandchild in its group, connects to the hub, lists the
/// tools, says so, pauses (for the test to see it running), calls one (which the server answers
/// 401), writes what it saw, then sleeps.
fn write_agent(dir: &std::path::Path) -> std::path::PathBuf {
    let sdk = node_modules().join("@modelcontextprotocol/sdk/dist/esm/client");
    let script = format!(
        r#"import fs from "node:fs";
import {{ spawn }} from "node:child_process";
import {{ Client }} from "{sdk}/index.js";
import {{ StreamableHTTPClientTransport }} from "{sdk}/streamableHttp.js";
const report = process.env.AGENT_REPORT;
const cfg = JSON.parse(fs.readFileSync(process.env.PI_CODING_AGENT_DIR + "/mcp.json", "utf8"));
const s = cfg.mcpServers.expiring;
spawn("sleep", ["60"], {{ stdio: "ignore" }});
const client = new Client({{ name: "agent", version: "1.0.0" }});
await client.connect(new StreamableHTTPClientTransport(new URL(s.url), {{ requestInit: {{ headers: s.headers }} }}));
const tools = await client.listTools();
fs.writeFileSync(report + ".listed", JSON.stringify(tools.tools.map((t) => t.name)));
await new Promise((r) => setTimeout(r, 500));
let outcome;
try {{
  const r = await client.callTool({{ name: tools.tools[0].name, arguments: {{ message: "hi" }} }});
  outcome = {{ result: r }};
}} catch (e) {{
  outcome = {{ error: String(e) }};
}}
fs.writeFileSync(report + ".called", JSON.stringify(outcome));
await new Promise((r) => setTimeout(r, 60000));
"#,
        sdk = sdk.display()
    );
    let path = dir.join("agent.mjs");
    std::fs::write(&path, script).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_mid_job_ends_the_job_and_the_agents_group() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let server = ExpiringServer::start().await;
        let file = job_file(&[(
            "expiring",
            json!({
                "url": server.url(),
                "headers": {"Authorization": "Bearer ${TOKEN}"},
                "description": "A server whose token is revoked after the tool list",
            }),
        )]);
        let job_dir = dir.path().join("job");
        let workspace = dir.path().join("workspace");
        std::fs::create_dir_all(&job_dir).unwrap();
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::write(job_dir.join("mcp.json"), &file.text).unwrap();
        let agent = write_agent(dir.path());
        let report = dir.path().join("report");
        let agent_marker = marker("agent");
        let env = runner_env(
            dir.path(),
            &[
                ("TOKEN", TOKEN),
                ("AGENT_MARK", &agent_marker),
                ("AGENT_REPORT", report.to_str().unwrap()),
            ],
        );
        let options = JobOptions {
            job_id: "job-401".to_owned(),
            input: protocol::job_dir::RunnerInput {
                mcp_digest: Some(file.digest.clone()),
                ..Default::default()
            },
            job_dir,
            workspace,
            agent_dir: dir.path().join("agent"),
            agent: hub::job::Agent::Command(vec![
                node().to_str().unwrap().to_owned(),
                agent.to_str().unwrap().to_owned(),
            ]),
            env,
            guard: None,
            confine: None,
            relay: None,
            key: None,
        };
        let started = std::time::Instant::now();
        // While the job runs: the agent and its sleeping child, once it has listed the tools.
        let probe = async {
            let listed = report.with_extension("listed");
            let until = std::time::Instant::now() + Duration::from_secs(30);
            while !listed.is_file() && std::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            processes_with(&agent_marker)
        };
        let (line, during) = tokio::join!(run(options), probe);
        let after = started.elapsed();
        let left = processes_with(&agent_marker);
        assert!(
            during.iter().any(|(_, cmd)| cmd.starts_with("sleep")),
            "the agent's child was not seen running: {during:?}"
        );

        let listed =
            std::fs::read_to_string(report.with_extension("listed")).unwrap_or_else(|_| {
                panic!(
                    "the agent never listed the tools: {line:?} {:?}",
                    server.seen()
                )
            });
        assert!(listed.contains("echo"), "{listed}");
        assert_eq!(line.reason.as_deref(), Some("mcp-unavailable"), "{line:?}");
        assert_eq!(line.code, 2, "{line:?}");
        assert_eq!(line.server.as_deref(), Some("expiring"), "{line:?}");
        assert!(
            line.cause.as_deref().unwrap_or_default().contains("401"),
            "{line:?}"
        );
        assert_eq!(line.servers.len(), 1);
        assert_eq!(line.servers[0].state, "ready");
        assert!(!format!("{line:?}").contains("cnry"), "{line:?}");
        assert!(
            after < Duration::from_secs(40),
            "the agent's sleep was waited out: {after:?}"
        );
        let seen = server.seen();
        assert!(
            seen.iter()
                .any(|(m, status)| m == "tools/call" && *status == 401),
            "the call reached the server and was answered 401: {seen:?}"
        );
        assert!(
            left.is_empty(),
            "the agent's group survived the job: {left:?}"
        );
    })
    .await;
}
