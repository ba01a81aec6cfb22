//! The runner holds each server to its pin: a real stdio server whose tool list a file decides,
//! an agent that lists and calls through the hub as pi would, and the runner's exit line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod runner_support;

use std::collections::BTreeMap;
use std::path::Path;

use hub::job::{JobOptions, run};
use protocol::exit_line::ExitLine;
use protocol::job_dir::RunnerInput;
use protocol::pins::{Listing, PinPolicy, ServerInfo};
use runner_support::{bounded, job_file, node, node_modules, runner_env};
use serde_json::{Value, json};

const ECHO: &str = r#"{"name": "echo", "description": "Echoes back the input",
  "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}},
  "annotations": {"readOnlyHint": true}}"#;
const ADD: &str = r#"{"name": "add", "description": "Adds two numbers",
  "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}"#;

/// What the server says: its version and its tools, each as written.
fn says(version: &str, tools: &[&str]) -> Value {
    let tools: Vec<Value> = tools
        .iter()
        .map(|t| serde_json::from_str(t).unwrap())
        .collect();
    json!({
        "serverInfo": {"name": "listed", "version": version},
        "rawTools": format!("[{}]", tools_text(&tools)),
        "tools": tools,
    })
}

fn tools_text(tools: &[Value]) -> String {
    tools
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The pin of what `says` says.
fn pin_of(version: &str, tools: &[&str]) -> Listing {
    let named: Vec<(String, &str)> = tools
        .iter()
        .map(|t| {
            let v: Value = serde_json::from_str(t).unwrap();
            (v["name"].as_str().unwrap().to_owned(), *t)
        })
        .collect();
    Listing::of(
        ServerInfo {
            name: Some("listed".into()),
            version: Some(version.into()),
        },
        named.iter().map(|(n, t)| (n.as_str(), *t)),
    )
}

/// An agent that lists the hub's tools of `listed`, calls each tool the server has (listed to it
/// or not), and writes what it saw.
fn write_agent(dir: &Path) -> std::path::PathBuf {
    let sdk = node_modules().join("@modelcontextprotocol/sdk/dist/esm/client");
    let script = format!(
        r#"import fs from "node:fs";
import {{ Client }} from "{sdk}/index.js";
import {{ StreamableHTTPClientTransport }} from "{sdk}/streamableHttp.js";
const cfg = JSON.parse(fs.readFileSync(process.env.PI_CODING_AGENT_DIR + "/mcp.json", "utf8"));
const s = cfg.mcpServers.listed;
const client = new Client({{ name: "agent", version: "1.0.0" }});
await client.connect(new StreamableHTTPClientTransport(new URL(s.url), {{ requestInit: {{ headers: s.headers }} }}));
const listed = (await client.listTools()).tools.map((t) => t.name).sort();
const called = {{}};
for (const name of ["echo", "add"]) {{
  try {{
    const r = await client.callTool({{ name, arguments: {{}} }});
    called[name] = r.isError ? "refused" : "answered";
  }} catch (e) {{
    called[name] = "refused";
  }}
}}
fs.writeFileSync(process.env.AGENT_REPORT, JSON.stringify({{ listed, called }}));
await client.close();
"#,
        sdk = sdk.display()
    );
    let path = dir.join("agent.mjs");
    std::fs::write(&path, script).unwrap();
    path
}

/// What the agent saw (`None`: it never ran), and the runner's exit line.
struct Ran {
    saw: Option<Value>,
    line: ExitLine,
}

/// Runs a job of the one server `listed`, which says `now`, under `pins` and `policy`.
async fn job(now: &Value, pins: Option<Listing>, policy: PinPolicy) -> Ran {
    job_of(now, pins, policy, false).await
}

/// [`job`], only listing when `list_only` (as `mcp pin`'s job).
async fn job_of(now: &Value, pins: Option<Listing>, policy: PinPolicy, list_only: bool) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let said = dir.path().join("says.json");
    std::fs::write(&said, now.to_string()).unwrap();
    let file = job_file(&[(
        "listed",
        json!({
            "command": "node",
            "args": [testkit::listed_server().to_str().unwrap(), said.to_str().unwrap()],
            "description": "A server whose words a file decides",
        }),
    )]);
    let job_dir = dir.path().join("job");
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&job_dir).unwrap();
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(job_dir.join("mcp.json"), &file.text).unwrap();
    let agent = write_agent(dir.path());
    let report = dir.path().join("report.json");
    let path = format!("{}:/usr/bin:/bin", node().parent().unwrap().display());
    let env = runner_env(
        dir.path(),
        &[("AGENT_REPORT", report.to_str().unwrap()), ("PATH", &path)],
    );
    let options = JobOptions {
        job_id: "job-pins".to_owned(),
        input: RunnerInput {
            mcp_digest: Some(file.digest.clone()),
            pins: pins
                .map(|p| BTreeMap::from([("listed".to_owned(), p)]))
                .unwrap_or_default(),
            pin_policy: policy,
            list_only,
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
    let line = bounded(run(options)).await;
    let saw = std::fs::read_to_string(&report)
        .ok()
        .map(|t| serde_json::from_str(&t).unwrap());
    Ran { saw, line }
}

fn listing(line: &ExitLine) -> &Listing {
    line.servers[0]
        .listing
        .as_ref()
        .unwrap_or_else(|| panic!("no listing on the exit line: {line:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_without_a_pin_offers_every_tool_and_says_what_it_listed() {
    let now = says("1.0.0", &[ECHO, ADD]);
    let ran = job(&now, None, PinPolicy::Withhold).await;
    assert_eq!(ran.line.code, 0, "{:?}", ran.line);
    let saw = ran.saw.expect("the agent ran");
    assert_eq!(saw["listed"], json!(["add", "echo"]));
    assert_eq!(
        saw["called"],
        json!({"echo": "answered", "add": "answered"})
    );
    // What the hub digested is what the test digests of the same definitions.
    assert_eq!(listing(&ran.line), &pin_of("1.0.0", &[ECHO, ADD]));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unchanged_server_offers_its_tools_as_pinned() {
    let now = says("1.0.0", &[ECHO, ADD]);
    let ran = job(
        &now,
        Some(pin_of("1.0.0", &[ADD, ECHO])),
        PinPolicy::Withhold,
    )
    .await;
    let saw = ran.saw.expect("the agent ran");
    assert_eq!(saw["listed"], json!(["add", "echo"]));
    assert_eq!(
        saw["called"],
        json!({"echo": "answered", "add": "answered"})
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_description_changed_by_one_character_and_a_new_tool_are_withheld() {
    let changed = ECHO.replace("the input", "the input.");
    let now = says("1.0.0", &[&changed, ADD]);
    // Pinned: echo as it was, and no add.
    let ran = job(&now, Some(pin_of("1.0.0", &[ECHO])), PinPolicy::Withhold).await;
    assert_eq!(ran.line.code, 0, "{:?}", ran.line);
    let saw = ran.saw.expect("the agent ran");
    assert_eq!(saw["listed"], json!([]));
    assert_eq!(saw["called"], json!({"echo": "refused", "add": "refused"}));
    assert_eq!(listing(&ran.line), &pin_of("1.0.0", &[&changed, ADD]));
    // The control: the same job with the server as pinned offers echo.
    let ran = job(
        &says("1.0.0", &[ECHO, ADD]),
        Some(pin_of("1.0.0", &[ECHO])),
        PinPolicy::Withhold,
    )
    .await;
    let saw = ran.saw.expect("the agent ran");
    assert_eq!(saw["listed"], json!(["echo"]));
    assert_eq!(saw["called"], json!({"echo": "answered", "add": "refused"}));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_schema_an_annotation_or_a_version_withholds_the_tools_it_touches() {
    let schema = ECHO.replace(r#""type": "string""#, r#""type": "number""#);
    let annotation = ECHO.replace("readOnlyHint", "destructiveHint");
    for (what, now, pin) in [
        (
            "schema",
            says("1.0.0", &[&schema, ADD]),
            pin_of("1.0.0", &[ECHO, ADD]),
        ),
        (
            "annotation",
            says("1.0.0", &[&annotation, ADD]),
            pin_of("1.0.0", &[ECHO, ADD]),
        ),
    ] {
        let saw = job(&now, Some(pin), PinPolicy::Withhold)
            .await
            .saw
            .expect("the agent ran");
        assert_eq!(saw["listed"], json!(["add"]), "{what}");
    }
    // Another version of the same server: none of its tools is offered.
    let saw = job(
        &says("1.0.1", &[ECHO, ADD]),
        Some(pin_of("1.0.0", &[ECHO, ADD])),
        PinPolicy::Withhold,
    )
    .await
    .saw
    .expect("the agent ran");
    assert_eq!(saw["listed"], json!([]));
}

#[tokio::test(flavor = "multi_thread")]
async fn under_refuse_drift_ends_the_job_before_the_agent_and_under_accept_it_is_offered() {
    let now = says("1.0.0", &[ECHO, ADD]);
    let pin = pin_of("1.0.0", &[ECHO]);
    let ran = job(&now, Some(pin.clone()), PinPolicy::Refuse).await;
    assert_eq!(
        ran.line.reason.as_deref(),
        Some("tool-drift"),
        "{:?}",
        ran.line
    );
    assert_eq!(ran.line.code, 2);
    assert_eq!(ran.line.server.as_deref(), Some("listed"));
    assert!(
        ran.line.cause.as_deref().unwrap().contains("add (new)"),
        "{:?}",
        ran.line
    );
    assert!(ran.saw.is_none(), "the agent ran: {:?}", ran.saw);
    // The record can say what the server listed.
    assert_eq!(listing(&ran.line), &pin_of("1.0.0", &[ECHO, ADD]));
    // The control: under refuse, a server as pinned runs the agent.
    let ran = job(
        &says("1.0.0", &[ECHO]),
        Some(pin.clone()),
        PinPolicy::Refuse,
    )
    .await;
    assert_eq!(ran.line.code, 0, "{:?}", ran.line);
    assert!(ran.saw.is_some());
    // Under accept, the new tool is offered.
    let saw = job(&now, Some(pin), PinPolicy::Accept)
        .await
        .saw
        .expect("the agent ran");
    assert_eq!(saw["listed"], json!(["add", "echo"]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listing_run_lists_the_server_and_never_starts_the_agent() {
    let now = says("1.1.0", &[ECHO, ADD]);
    let ran = job_of(
        &now,
        Some(pin_of("1.0.0", &[ECHO])),
        PinPolicy::Accept,
        true,
    )
    .await;
    assert_eq!(ran.line.code, 0, "{:?}", ran.line);
    assert_eq!(ran.line.reason, None);
    assert!(ran.saw.is_none(), "the agent ran: {:?}", ran.saw);
    assert_eq!(listing(&ran.line), &pin_of("1.1.0", &[ECHO, ADD]));
    // The control: the same job, not only listing, runs the agent.
    let ran = job_of(
        &now,
        Some(pin_of("1.0.0", &[ECHO])),
        PinPolicy::Accept,
        false,
    )
    .await;
    assert!(ran.saw.is_some(), "{:?}", ran.line);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_past_a_pins_bounds_is_withheld_under_accept_and_counted() {
    let long = format!(
        r#"{{"name": "{}", "description": "long"}}"#,
        "x".repeat(129)
    );
    let now = says("1.0.0", &[ECHO, &long]);
    let ran = job(&now, None, PinPolicy::Accept).await;
    let saw = ran.saw.expect("the agent ran");
    // The control: echo is offered; the long name is never listed to the agent.
    assert_eq!(saw["listed"], json!(["echo"]));
    assert_eq!(listing(&ran.line).unpinnable, 1);
}
