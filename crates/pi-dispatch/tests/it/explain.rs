//! `pi-dispatch explain` end to end, on a deployment made by init with an image and triggers.

use serde_json::Value;

use crate::common::{Deployment, Run};

const OVERLAY: &str = r#"{"mcpServers": {
  "docs": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}, "description": "Docs"},
  "tickets": {"url": "https://tickets.example.com/mcp", "headers": {"X-Api-Key": "${TICKETS_KEY}"}, "description": "Tickets"}
}}"#;

const TRIGGERS: &str = r#"{"triggers": [
  {"on": {"type": "label", "any": ["pi"]},
   "run": {"kind": "github", "flow": "fix", "mcp": ["forge", "docs"], "secrets": {"DOCS_TOKEN": "op://ci/docs/CNRY-ref"}}},
  {"on": {"type": "label", "any": ["tickets"]},
   "run": {"kind": "github", "flow": "answer", "mcp": ["tickets"]}},
  {"on": {"type": "cron", "id": "nightly", "pattern": "0 3 * * *"},
   "run": {"kind": "local", "command": "make check", "folder": "/srv/repo", "task": "Run the checks"}}
]}"#;

fn deployment() -> Deployment {
    let d = Deployment::new();
    assert_eq!(d.run(&["init"]).code, 0);
    d.write("pi-global/mcp.json", OVERLAY);
    d.write("triggers.json", TRIGGERS);
    d.write("egress-allowlist.conf", ".example.com\napi.github.com\n");
    d.write(
        "images/pi-job/image.json",
        r#"{"labels": {"dev.pi-dispatch.capabilities": "mcp,forgeMcp"}}"#,
    );
    d.write(".env", "PI_JOB_IMAGE=pi-job\n");
    d
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
}

#[test]
fn an_admitted_job_shows_its_mcp_json() {
    let d = deployment();
    let run = d.run(&["explain", "--trigger", "0", "--json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report = json(&run);
    assert_eq!(report["outcome"], "admit");
    assert_eq!(report["reason"], Value::Null);
    let servers = report["mcpJson"]["mcpServers"].as_object().unwrap();
    assert_eq!(servers.keys().collect::<Vec<_>>(), ["docs", "forge"]);
    assert_eq!(
        servers["docs"]["headers"]["Authorization"],
        "Bearer ${DOCS_TOKEN}"
    );
    assert_eq!(report["mcpDigest"].as_str().unwrap().len(), 64);
    // The job's file in its own order: the overlay entry's keys as written.
    let docs_at = run.stdout.find("\"url\"").unwrap();
    assert!(docs_at < run.stdout.find("\"headers\"").unwrap());
    assert!(
        run.stdout.find("\"headers\"").unwrap()
            < run.stdout.find("\"description\": \"Docs\"").unwrap()
    );
    let human = d.run(&["explain", "--trigger", "0"]);
    assert!(human.stdout.contains("✓ admit"), "{}", human.stdout);
    assert!(!human.stdout.contains("CNRY"), "{}", human.stdout);
}

#[test]
fn a_refused_job_shows_the_reason_comment_and_log() {
    let d = deployment();
    let run = d.run(&["explain", "--trigger", "1", "--json"]);
    assert_eq!(run.code, 1);
    let report = json(&run);
    assert_eq!(report["outcome"], "policy");
    assert_eq!(report["reason"], "mcp-secret-unmapped");
    assert!(report["comment"].as_str().unwrap().contains("`tickets`"));
    assert!(!report["comment"].as_str().unwrap().contains("TICKETS_KEY"));
    assert_eq!(report["log"]["event"], "refused_mcp");
    assert_eq!(report["server"], "tickets");
    assert_eq!(report["log"]["reason"], "mcp-secret-unmapped");
    assert!(
        report["log"]["detail"]
            .as_str()
            .unwrap()
            .contains("TICKETS_KEY")
    );
    assert_eq!(report["mcpJson"], Value::Null);
}

#[test]
fn a_job_without_servers_and_the_image_capability() {
    let d = deployment();
    let report = json(&d.run(&["explain", "--trigger", "2", "--json"]));
    assert_eq!(report["outcome"], "admit");
    assert_eq!(report["mcpJson"], Value::Null);

    d.write(
        "images/pi-job/image.json",
        r#"{"labels": {"dev.pi-dispatch.capabilities": "mcp"}}"#,
    );
    let report = json(&d.run(&["explain", "--trigger", "0", "--json"]));
    assert_eq!(report["reason"], "job-image-forge-mcp-unsupported");
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
    assert!(run.stderr.contains("refused"), "{}", run.stderr);
}
