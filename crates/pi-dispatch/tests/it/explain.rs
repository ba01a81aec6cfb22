//! `pi-dispatch explain` end to end, on a deployment made by init with an image, a repository and
//! triggers: it says what the worker's admission would decide.

use serde_json::Value;

use crate::common::{Deployment, Run};

const OVERLAY: &str = r#"{"mcpServers": {
  "docs": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}, "description": "Docs"},
  "tickets": {"url": "https://tickets.example.com/mcp", "headers": {"X-Api-Key": "${TICKETS_KEY}"}, "description": "Tickets"}
}}"#;

fn triggers(repo: &str) -> String {
    format!(
        r#"{{"triggers": [
  {{"on": {{"type": "cron", "id": "nightly", "pattern": "0 3 * * *"}},
   "run": {{"kind": "local", "flow": "fix", "folder": "{repo}", "task": "Fix it", "mcp": ["docs"], "secrets": {{"DOCS_TOKEN": "op://ci/docs/CNRY-ref"}}}}}},
  {{"on": {{"type": "cron", "id": "tickets", "pattern": "0 4 * * *"}},
   "run": {{"kind": "local", "flow": "answer", "folder": "{repo}", "task": "Answer", "mcp": ["tickets"]}}}},
  {{"on": {{"type": "cron", "id": "checks", "pattern": "0 5 * * *"}},
   "run": {{"kind": "local", "command": "make check", "folder": "{repo}", "task": "Run the checks"}}}},
  {{"on": {{"type": "label", "any": ["pi"]}},
   "run": {{"kind": "github", "flow": "fix", "mcp": ["forge", "docs"], "secrets": {{"DOCS_TOKEN": "op://ci/docs/CNRY-ref"}}}}}},
  {{"on": {{"type": "cron", "id": "many", "pattern": "0 6 * * *"}},
   "run": {{"kind": "local", "flow": "fix", "folder": "{repo}", "task": "Fix it", "mcp": ["docs", "wiki", "blog"]}}}}
]}}"#
    )
}

fn deployment() -> Deployment {
    let d = Deployment::new();
    assert_eq!(d.run(&["init"]).code, 0);
    d.write("pi-global/mcp.json", OVERLAY);
    let repo = d.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    if rustix::process::geteuid().is_root() {
        let ok = std::process::Command::new("chown")
            .args(["65534:65534"])
            .arg(&repo)
            .status()
            .unwrap();
        assert!(ok.success());
    }
    d.write("triggers.json", &triggers(repo.to_str().unwrap()));
    d.write("egress-allowlist.conf", ".example.com\napi.github.com\n");
    d.write(
        "images/pi-job/image.json",
        r#"{"labels": {"dev.pi-dispatch.capabilities": "mcp,forgeMcp"}}"#,
    );
    d.write("images/pi-job/bin/pi-dispatch", "");
    d.write(
        ".env",
        "PI_JOB_IMAGE=pi-job\nPI_EGRESS=0\nPI_PROVIDER=openai\nPI_MODEL=gpt-4o\nOPENAI_API_KEY=k-1\n",
    );
    d
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
}

#[test]
fn an_admitted_job_shows_everything_it_runs_with() {
    let d = deployment();
    let run = d.run(&["explain", "--trigger", "0", "--json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report = json(&run);
    assert_eq!(report["outcome"], "admit");
    assert_eq!(report["reason"], Value::Null);
    let admitted = &report["admitted"];
    assert_eq!(admitted["image"], "pi-job");
    assert_eq!(admitted["servers"], serde_json::json!(["docs"]));
    assert_eq!(admitted["model"]["provider"], "openai");
    assert_eq!(admitted["model"]["keyVariable"], "OPENAI_API_KEY");
    assert_eq!(admitted["secrets"][0]["name"], "DOCS_TOKEN");
    assert_eq!(admitted["egress"]["policy"], "off");
    let servers = report["mcpJson"]["mcpServers"].as_object().unwrap();
    assert_eq!(servers.keys().collect::<Vec<_>>(), ["docs"]);
    assert_eq!(
        servers["docs"]["headers"]["Authorization"],
        "Bearer ${DOCS_TOKEN}"
    );
    assert_eq!(report["mcpDigest"].as_str().unwrap().len(), 64);
    // The job's file in its own order: the overlay entry's keys as written.
    let docs_at = run.stdout.find("\"url\"").unwrap();
    assert!(docs_at < run.stdout.find("\"headers\"").unwrap());
    let human = d.run(&["explain", "--trigger", "0"]);
    assert!(human.stdout.contains("✓ admit"), "{}", human.stdout);
    // No value of the environment reaches the report (a reference names a place, not a value).
    assert!(!run.stdout.contains("k-1") && !human.stdout.contains("k-1"));
}

#[test]
fn a_refused_job_shows_the_reason_detail_fix_and_comment() {
    let d = deployment();
    let run = d.run(&["explain", "--trigger", "1", "--json"]);
    assert_eq!(run.code, 1);
    let report = json(&run);
    assert_eq!(report["outcome"], "policy");
    assert_eq!(report["reason"], "mcp-secret-unmapped");
    assert!(report["comment"].as_str().unwrap().contains("`tickets`"));
    assert!(!report["comment"].as_str().unwrap().contains("TICKETS_KEY"));
    assert!(!report["sentence"].as_str().unwrap().contains("TICKETS_KEY"));
    assert_eq!(report["server"], "tickets");
    assert_eq!(report["detail"]["server"], "tickets");
    assert_eq!(
        report["detail"]["variables"],
        serde_json::json!(["TICKETS_KEY"])
    );
    assert!(report["fix"].as_str().unwrap().contains("TICKETS_KEY"));
    assert_eq!(report["mcpJson"], Value::Null);
    let human = d.run(&["explain", "--trigger", "1"]);
    assert!(
        human.stdout.contains("fix: map TICKETS_KEY"),
        "{}",
        human.stdout
    );
}

#[test]
fn every_unknown_server_is_named() {
    let d = deployment();
    let report = json(&d.run(&["explain", "--trigger", "4", "--json"]));
    assert_eq!(report["reason"], "mcp-server-unknown");
    assert_eq!(
        report["detail"]["servers"],
        serde_json::json!(["wiki", "blog"])
    );
}

#[test]
fn what_the_worker_would_refuse_is_refused_here_too() {
    let d = deployment();
    let report = json(&d.run(&["explain", "--trigger", "2", "--json"]));
    assert_eq!(report["outcome"], "admit");
    assert_eq!(report["mcpJson"], Value::Null);
    // A forge trigger passes every MCP gate, and the worker refuses it until a GitHub App is
    // set up to mint its token.
    let report = json(&d.run(&["explain", "--trigger", "3", "--json"]));
    assert_eq!(report["reason"], "forge-unconfigured");
    d.write(
        "images/pi-job/image.json",
        r#"{"labels": {"dev.pi-dispatch.capabilities": "mcp"}}"#,
    );
    let report = json(&d.run(&["explain", "--trigger", "3", "--json"]));
    assert_eq!(report["reason"], "job-image-forge-mcp-unsupported");
    // Egress on, the default: a server out of the proxy's reach refuses the job that names it.
    let env = std::fs::read_to_string(d.path().join(".env")).unwrap();
    d.write(".env", &env.replace("PI_EGRESS=0\n", ""));
    d.write("egress-allowlist.conf", "api.github.com\n");
    let report = json(&d.run(&["explain", "--trigger", "0", "--json"]));
    assert_eq!(report["reason"], "mcp-egress-unreachable");
    assert_eq!(report["server"], "docs");
    let report = json(&d.run(&["explain", "--trigger", "2", "--json"]));
    assert_eq!(report["outcome"], "admit", "{report:#}");
    assert_eq!(report["admitted"]["egress"]["policy"], "on", "{report:#}");
    d.write("egress-allowlist.conf", ".example.com\napi.github.com\n");
    // No key for the model.
    d.write(".env", &env.replace("OPENAI_API_KEY=k-1\n", ""));
    let report = json(&d.run(&["explain", "--trigger", "2", "--json"]));
    assert_eq!(report["reason"], "model-key-missing");
}

#[test]
fn bad_input_exits_2() {
    let d = deployment();
    assert_eq!(d.run(&["explain", "--trigger", "9"]).code, 2);
    assert_eq!(d.run(&["explain"]).code, 2);
    d.write("event.json", "[1]");
    assert_eq!(
        d.run(&["explain", "--trigger", "0", "--event", "event.json"])
            .code,
        2
    );
    d.write("event.json", r#"{"action": "labeled"}"#);
    assert_eq!(
        d.run(&["explain", "--trigger", "0", "--event", "event.json"])
            .code,
        0
    );
    d.write("triggers.json", r#"{"triggers": [{"on": {}, "run": {}}]}"#);
    let run = d.run(&["explain", "--trigger", "0"]);
    assert_eq!(run.code, 2);
    // Said once, with the file's own path.
    assert_eq!(run.stderr.matches("refused").count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.starts_with(&format!(
            "pi-dispatch: {}",
            d.path().join("triggers.json").display()
        )),
        "{}",
        run.stderr
    );
    // With --json, the refusal is JSON on stdout too.
    let run = d.run(&["explain", "--trigger", "0", "--json"]);
    assert_eq!(run.code, 2);
    let report = json(&run);
    assert_eq!(report["outcome"], "unusable");
    assert!(report["error"].as_str().unwrap().contains("refused"));
}

#[test]
fn with_egress_on_it_lists_the_hosts_the_job_needs_and_what_the_allowlist_lacks() {
    let d = deployment();
    d.write(
        ".env",
        "PI_JOB_IMAGE=pi-job\nPI_PROVIDER=llm\nPI_MODEL=m1\nLLM_KEY=k-1\n",
    );
    d.write(
        "pi-global/models.json",
        r#"{"providers": {"llm": {"baseUrl": "https://llm.other.example.org/v1", "api": "openai-completions", "apiKey": "$LLM_KEY", "models": [{"id": "m1"}]}}}"#,
    );
    let run = d.run(&["explain", "--trigger", "0", "--json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report = json(&run);
    assert_eq!(report["admitted"]["egress"]["policy"], "on");
    assert_eq!(
        report["egressNeeds"],
        serde_json::json!([
            {"for": "docs", "host": "mcp.example.com", "port": 443, "reachable": true, "how": "allowlist"},
            {"for": "model", "host": "llm.other.example.org", "port": 443, "reachable": false, "how": "egress-not-allowed"}
        ])
    );
    let human = d.run(&["explain", "--trigger", "0"]);
    assert!(
        human
            .stdout
            .contains("server docs: mcp.example.com:443 (allowlist)"),
        "{}",
        human.stdout
    );
    assert!(
        human
            .stdout
            .contains("egress-allowlist.conf lacks: llm.other.example.org"),
        "{}",
        human.stdout
    );
    // Declared, the model's host and port is reached as an endpoint.
    d.write(
        "model-endpoints.json",
        r#"{"version": 1, "endpoints": [{"id": "llm", "host": "llm.other.example.org", "port": 443}]}"#,
    );
    let report = json(&d.run(&["explain", "--trigger", "0", "--json"]));
    assert_eq!(report["egressNeeds"][1]["how"], "endpoint llm");
    // A model of pi's built-in catalog: its address is pi's, and explain says to allowlist it.
    d.write(
        ".env",
        "PI_JOB_IMAGE=pi-job\nPI_PROVIDER=openai\nPI_MODEL=gpt-4o\nOPENAI_API_KEY=k-1\n",
    );
    let human = d.run(&["explain", "--trigger", "0"]);
    assert!(
        human
            .stdout
            .contains("model openai/gpt-4o: pi's built-in provider"),
        "{}",
        human.stdout
    );
}
