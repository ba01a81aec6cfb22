//! pi starts while the job's servers connect: a server that answers only once pi has loaded (it
//! waits for a file an overlay extension writes as pi loads) is connected and listed, and pi's
//! prompt still waits for it; one that fails once pi has loaded ends pi and the job for the
//! server's own reason, before any model call. Started one after the other, as the runner used
//! to, the first job would wait for a server that waits for pi, and fail.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod runner_support;

use protocol::exit_line::ExitLine;
use runner_support::job_file;
use runner_support::pi::{Folders, PiJob, Transport, folders, run_pi_job_over, write};
use serde_json::json;
use testkit::fake_model::{FakeModel, MODEL, PROVIDER, Step};

/// A stdio server that sleeps `SLEEP_MS` and waits for `PI_LOADED` (a file) when they are set
/// before it reads anything, then either
/// serves one tool, `ping`, or (with `FAIL_AFTER_PI`) exits with a line on stderr. It gives up
/// waiting after 20 s.
const WAITS_FOR_PI: &str = r#"
import { existsSync } from "node:fs";
import readline from "node:readline";
if (process.env.SLEEP_MS) await new Promise((r) => setTimeout(r, Number(process.env.SLEEP_MS)));
const deadline = Date.now() + 20000;
while (process.env.PI_LOADED && !existsSync(process.env.PI_LOADED)) {
  if (Date.now() > deadline) { process.stderr.write("pi never loaded\n"); process.exit(3); }
  await new Promise((r) => setTimeout(r, 10));
}
if (process.env.FAIL_AFTER_PI) { process.stderr.write("failing once pi has loaded\n"); process.exit(1); }
const out = (m) => process.stdout.write(JSON.stringify(m) + "\n");
for await (const line of readline.createInterface({ input: process.stdin })) {
  const m = JSON.parse(line);
  if (m.id === undefined) continue;
  if (m.method === "initialize") {
    out({ jsonrpc: "2.0", id: m.id, result: { protocolVersion: m.params.protocolVersion,
      capabilities: { tools: {} }, serverInfo: { name: "late", version: "1.0.0" } } });
  } else if (m.method === "tools/list") {
    out({ jsonrpc: "2.0", id: m.id, result: { tools: [{ name: "ping", description: "Answers pong",
      inputSchema: { type: "object", properties: {} } }] } });
  } else if (m.method === "tools/call") {
    out({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text", text: "pong" }] } });
  } else {
    out({ jsonrpc: "2.0", id: m.id, result: {} });
  }
}
"#;

/// Runs a job whose one server waits for pi to load; `fail` makes it exit once pi has.
async fn run_with_a_server_waiting_for_pi(
    f: &Folders,
    model: &FakeModel,
    fail: bool,
    transport: Transport,
) -> ExitLine {
    let script = f.workspace.join("late.mjs");
    write(&script, WAITS_FOR_PI);
    let marker = f.workspace.join("pi-loaded");
    // An overlay extension: pi runs it as it loads, before it connects its MCP servers.
    write(
        &f.overlay.join("extensions/loaded.js"),
        &format!(
            "import {{ writeFileSync }} from \"node:fs\";\nexport default function () {{ writeFileSync({:?}, \"\"); }}\n",
            marker.to_str().unwrap()
        ),
    );
    let mut env = json!({"PI_LOADED": "${PI_LOADED}"});
    if fail {
        env["FAIL_AFTER_PI"] = json!("${FAIL_AFTER_PI}");
    }
    let late = json!({"command": "node", "args": [script.to_str().unwrap()], "env": env,
        "description": "Answers once pi has loaded", "exposure": "direct", "timeout": 40});
    let file = job_file(&[("late", late)]);
    let vars = [
        ("PI_LOADED", marker.to_str().unwrap()),
        ("FAIL_AFTER_PI", "1"),
    ];
    run_ping_job(f, &file, model, &vars, transport).await
}

/// Runs `file` with real pi asked to call the ping tool, against `model`, with `vars` beside the
/// model's key.
async fn run_ping_job(
    f: &Folders,
    file: &protocol::job_mcp::JobMcpFile,
    model: &FakeModel,
    vars: &[(&str, &str)],
    transport: Transport,
) -> ExitLine {
    let mut all = vec![("FAKE_API_KEY", "cnry-model-key-5e2")];
    all.extend_from_slice(vars);
    run_pi_job_over(
        f,
        PiJob {
            id: "job-start",
            file,
            prompt: "Call the ping tool, then say done.\n",
            models_json: &model.models_json("FAKE_API_KEY"),
            model: &format!("{PROVIDER}/{MODEL}"),
            vars: &all,
            input: Default::default(),
        },
        transport,
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn pi_loads_while_the_servers_connect_and_its_prompt_waits_for_them() {
    let f = folders();
    let model = FakeModel::start(vec![
        Step::call("mcp__late__ping", json!({})),
        Step::text("done"),
    ]);
    let line = run_with_a_server_waiting_for_pi(&f, &model, false, Transport::Relay).await;
    let requests = model.requests();
    assert_eq!(line.code, 0, "{line:?}");
    assert!(line.servers.iter().all(|s| s.state == "ready"), "{line:?}");
    // The first model request already declared the server's tool: the prompt waited for it.
    assert!(
        requests[0].tools().iter().any(|t| t == "mcp__late__ping"),
        "{:?}",
        requests[0].tools()
    );
    assert!(
        requests[1].last_text().contains("pong"),
        "{:?}",
        requests[1].last_text()
    );
    let pinged = line
        .tool_calls
        .iter()
        .find(|c| c.server == "late" && c.tool == "ping")
        .map_or(0, |c| c.ok);
    assert_eq!(pinged, 1, "{:?}", line.tool_calls);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_fails_while_pi_loads_ends_the_job_for_its_own_reason() {
    let f = folders();
    let model = FakeModel::start(vec![Step::text("done")]);
    let line = run_with_a_server_waiting_for_pi(&f, &model, true, Transport::Relay).await;
    assert!(f.workspace.join("pi-loaded").exists(), "pi had started");
    assert_eq!(line.reason.as_deref(), Some("mcp-unavailable"), "{line:?}");
    assert_eq!(line.server.as_deref(), Some("late"), "{line:?}");
    assert_eq!(line.code, 2, "{line:?}");
    assert!(line.servers.iter().all(|s| s.state == "failed"), "{line:?}");
    assert!(model.requests().is_empty(), "pi's prompt went out");
}

/// Over HTTP the runner still connects every server before pi starts: the same server never
/// sees pi load, and the job says so.
#[tokio::test(flavor = "multi_thread")]
async fn over_http_pi_starts_only_once_the_servers_are_connected() {
    let f = folders();
    let model = FakeModel::start(vec![Step::text("done")]);
    let line = run_with_a_server_waiting_for_pi(&f, &model, false, Transport::Http).await;
    assert_ne!(line.code, 0, "{line:?}");
    assert_eq!(line.server.as_deref(), Some("late"), "{line:?}");
    // It gave up waiting for pi.
    assert_eq!(line.reason.as_deref(), Some("mcp-unavailable"), "{line:?}");
    assert!(
        !f.workspace.join("pi-loaded").exists(),
        "pi started before its servers"
    );
    assert!(model.requests().is_empty());
}

/// A server whose wait in pi (its `timeout`, 5 s) is shorter than the runner's (15 s), beside one
/// that takes 8 s to answer: pi would give up on the first while the hub waited for the second,
/// so pi starts only once both are served.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_with_a_short_timeout_keeps_pi_from_starting_before_the_slow_one() {
    let f = folders();
    let script = f.workspace.join("slow.mjs");
    write(&script, WAITS_FOR_PI);
    let quick = json!({"command": "node", "args": [testkit::everything().to_str().unwrap(), "stdio"],
        "description": "Everything, quick to answer", "exposure": "direct", "timeout": 5});
    let slow = json!({"command": "node", "args": [script.to_str().unwrap()],
        "env": {"SLEEP_MS": "${SLEEP_MS}"}, "description": "Slow to answer", "exposure": "direct"});
    let file = job_file(&[("quick", quick), ("slow", slow)]);
    let model = FakeModel::start(vec![
        Step::call("mcp__slow__ping", json!({})),
        Step::text("done"),
    ]);
    let line = run_ping_job(&f, &file, &model, &[("SLEEP_MS", "8000")], Transport::Relay).await;
    assert_eq!(line.code, 0, "{line:?}");
    let requests = model.requests();
    let tools = requests[0].tools();
    assert!(
        tools.iter().any(|t| t == "mcp__quick__echo")
            && tools.iter().any(|t| t == "mcp__slow__ping"),
        "{tools:?}"
    );
}
