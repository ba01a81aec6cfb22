//! `rerun`: a job runs again as it was queued, through the admission as any job. A job refused
//! at pickup (its server no longer offered) is refused again while the cause stands, and completes
//! once it is fixed; the two records name each other.

use serde_json::json;
use testkit::fake_model::Step;

use crate::worker::{Service, stdio};

#[test]
fn a_refused_job_runs_again_once_its_cause_is_fixed() {
    let s = Service::new(
        vec![Step::text("Done, the second time.")],
        |_| json!({"docs": stdio(Some("direct")), "gone": stdio(None)}),
        "",
    );
    let offered = std::fs::read_to_string(s.d.path().join("pi-global/mcp.json")).unwrap();
    let id = s.queue("Use both servers.", "docs,gone");
    // Queued, it cannot be run again: it has not ended.
    let early = s.cli(&["rerun", &id]);
    assert_eq!(early.code, 1, "{}", early.stdout);
    assert!(early.stderr.contains("has not ended"), "{}", early.stderr);
    // The server goes away before the worker picks the job up: refused.
    s.d.write(
        "pi-global/mcp.json",
        &json!({"mcpServers": {"docs": stdio(Some("direct"))}}).to_string(),
    );
    s.work();
    assert_eq!(s.record(&id)["reason"], "mcp-server-unknown");
    // Run again while the cause stands: the admission refuses it, and nothing is queued.
    let refused = s.cli(&["rerun", &id]);
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("mcp-server-unknown"),
        "{}",
        refused.stderr
    );
    let status = s.cli(&["status", "--json"]);
    let status: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(status["open"].as_array().unwrap().len(), 0, "{status:#}");
    // Fixed (the server offered again), it runs again and completes.
    s.d.write("pi-global/mcp.json", &offered);
    let again = s.cli(&["rerun", &id]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(
        again.stdout.starts_with("Queued rerun-"),
        "{}",
        again.stdout
    );
    let new = again
        .stdout
        .split_whitespace()
        .nth(1)
        .unwrap()
        .trim_end_matches(',');
    s.work();
    let record = s.record(new);
    assert_eq!(record["outcome"], "completed", "{record:#}");
    assert_eq!(record["rerunOf"], id.as_str());
    assert_eq!(record["task"], "Use both servers.");
    assert_eq!(record["job"]["mcp"], json!(["docs", "gone"]));
    // Linked both ways.
    let original = s.cli(&["runs", "show", &id]);
    assert!(
        original.stdout.contains(&format!("run again as: {new}")),
        "{}",
        original.stdout
    );
    let rerun = s.cli(&["runs", "show", new]);
    assert!(
        rerun.stdout.contains(&format!("runs again: {id}")),
        "{}",
        rerun.stdout
    );
    // An id that is nowhere.
    let nowhere = s.cli(&["rerun", "no-such-job"]);
    assert_eq!(nowhere.code, 2, "{}", nowhere.stdout);
}
