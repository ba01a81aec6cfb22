//! An outcome is a claim: a job is `completed` only when real pi finished its task. A model that
//! cannot be reached, that answers 500, or that refuses the key is a failure with its own reason,
//! and the record says nothing was spent. What the agent did is kept as its transcript, with every
//! secret the worker knows redacted.

use serde_json::{Value, json};
use testkit::fake_model::{ERROR_BODY_CANARY, Step};

use crate::worker::{EVERYTHING, MODEL_KEY, Service, stdio};

/// A job on a deployment whose model fails as `script` says (or, with `down`, whose model's port
/// has nothing listening), run to its record.
fn failing(script: Vec<Step>, down: bool) -> (Service, Value, crate::common::Run) {
    let s = Service::new(script, |_| json!({"direct": stdio(None)}), "");
    if down {
        // A port that was free a moment ago and is closed now.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let models = s
            .model
            .models_json("FAKE_API_KEY")
            .replace(&s.model.port.to_string(), &port.to_string());
        s.d.write("pi-global/models.json", &models);
    }
    let id = s.queue("Do the work.", "direct");
    let run = s.work();
    let record = s.record(&id);
    (s, record, run)
}

#[test]
fn a_model_that_fails_is_never_a_completed_job() {
    // Three deployments at once: each job waits out pi's own retries (about 15 s).
    let down = std::thread::spawn(|| failing(vec![], true));
    let error = std::thread::spawn(|| failing(vec![Step::status(500); 8], false));
    let refused = std::thread::spawn(|| failing(vec![Step::status(401); 8], false));
    for (handle, reason, retried) in [
        (down, "model-unreachable", true),
        (error, "model-error", false),
        (refused, "model-unauthorized", false),
    ] {
        let (s, record, run) = handle.join().unwrap();
        assert_eq!(record["outcome"], "failed", "{reason}: {record:#}");
        assert_eq!(record["reason"], reason, "{record:#}");
        assert_eq!(record["turns"], 0, "{record:#}");
        assert_eq!(record["spent"], false, "{record:#}");
        assert_eq!(record["budgetReserved"], true, "{record:#}");
        assert!(record["fix"].is_string(), "{record:#}");
        // A provider that could not be reached is tried again (nothing was spent); the others
        // are not.
        assert_eq!(record["attempt"], if retried { 2 } else { 1 }, "{record:#}");
        // What the provider said is in the transcript (it is what happened), never in the record or
        // the worker's log.
        let text = record.to_string();
        assert!(!text.contains(ERROR_BODY_CANARY), "{text}");
        assert!(!run.stderr.contains(ERROR_BODY_CANARY), "{}", run.stderr);
        if !s.model.requests().is_empty() {
            let shown = s.d.run(&[
                "runs",
                "show",
                record["jobId"].as_str().unwrap(),
                "--transcript",
            ]);
            assert!(shown.stdout.contains(ERROR_BODY_CANARY), "{}", shown.stdout);
        }
        // The record's reason is on the worker's log line for the job's end.
        assert!(
            run.stderr.contains("job_ended") && run.stderr.contains(reason),
            "{}",
            run.stderr
        );
    }
}

#[test]
fn the_transcript_keeps_what_the_agent_did_with_every_secret_redacted() {
    const TOKEN: &str = "cnry-docs-token-93b1";
    let s = Service::new(
        vec![
            Step::call("mcp__vault__get_env", json!({})),
            Step::call("bash", json!({"command": "env"})),
            Step::text(&format!(
                "Done. The server's token was {TOKEN}, the model's key {MODEL_KEY}."
            )),
        ],
        |_| {
            json!({"vault": {"command": "node", "args": [EVERYTHING, "stdio"],
                "env": {"DOCS_TOKEN": "${DOCS_TOKEN}"}, "description": "Sees a secret", "exposure": "direct"}})
        },
        "PI_FORWARD_ENV=DOCS_TOKEN\n",
    );
    let id = {
        s.seal();
        let mut cmd = s.d.command(&[
            "run",
            s.repo.to_str().unwrap(),
            "--task",
            "Look around.",
            "--mcp",
            "vault",
        ]);
        cmd.env("FAKE_API_KEY", MODEL_KEY).env("DOCS_TOKEN", TOKEN);
        let run = crate::common::Run::from(cmd.output().unwrap());
        assert_eq!(run.code, 0, "{}", run.stderr);
        crate::worker::queued_id(&run)
    };
    let mut worker = s.worker_command(&[]);
    worker.env("DOCS_TOKEN", TOKEN);
    let run = crate::common::Run::from(worker.output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    let record = s.record(&id);
    assert_eq!(record["outcome"], "completed", "{record:#}");
    assert_eq!(record["transcript"], true);
    // The model really saw the server's secret (its env): the test is not empty. pi's own env has
    // a stand-in for the provider's key, never the key (the runner's model gateway holds it), so
    // the key reaches the transcript only in the model's own words.
    let results = s.results();
    assert!(results[1].contains(TOKEN), "{results:#?}");
    assert!(
        results[2].contains("FAKE_API_KEY=pi-dispatch-stand-in-"),
        "{results:#?}"
    );
    assert!(!results[2].contains(MODEL_KEY), "{results:#?}");
    // The transcript has every event, and neither value.
    let path = s.d.path().join(format!("state/jobs/{id}/transcript.jsonl"));
    let text = std::fs::read_to_string(&path).unwrap();
    for line in text.lines() {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    }
    assert!(text.contains("\"type\":\"tool_execution_end\""), "{text}");
    assert!(text.contains("[redacted:DOCS_TOKEN]"), "{text}");
    assert!(text.contains("[redacted:FAKE_API_KEY]"), "{text}");
    assert!(!text.contains(TOKEN) && !text.contains(MODEL_KEY));
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // The agent's last words are in the record, redacted too.
    assert_eq!(
        record["finalMessage"],
        "Done. The server's token was [redacted:DOCS_TOKEN], the model's key [redacted:FAKE_API_KEY]."
    );
    let shown = s.d.run(&["runs", "show", &id, "--transcript"]);
    assert_eq!(shown.code, 0);
    assert_eq!(shown.stdout, text);
    let human = s.d.run(&["runs", "show", &id]);
    assert!(
        human.stdout.contains("final message:") && !human.stdout.contains(TOKEN),
        "{}",
        human.stdout
    );
    // Nothing of the deployment holds either value (but the images, which hold no secret).
    for (path, bytes) in crate::common::files_under(s.d.path()) {
        if path.starts_with(s.d.path().join("images")) {
            continue;
        }
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains(TOKEN) && !text.contains(MODEL_KEY),
            "{} holds a secret",
            path.display()
        );
    }
    assert!(!run.stderr.contains(TOKEN) && !run.stderr.contains(MODEL_KEY));
    // Nor what the queue and the records say, in either form.
    for args in [
        &["status", "--json"][..],
        &["status"][..],
        &["runs", "--json"][..],
        &["runs", "show", &id, "--json"][..],
    ] {
        let out = s.d.run(args);
        assert!(
            !out.stdout.contains(TOKEN) && !out.stdout.contains(MODEL_KEY),
            "{args:?}: {}",
            out.stdout
        );
    }
}

#[test]
fn transcripts_can_be_turned_off() {
    let s = Service::new(
        vec![Step::text("done")],
        |_| json!({"direct": stdio(None)}),
        "PI_TRANSCRIPTS=0\n",
    );
    let id = s.queue("Anything.", "direct");
    s.work();
    let record = s.record(&id);
    assert_eq!(record["outcome"], "completed", "{record:#}");
    assert_eq!(record["transcript"], false);
    assert!(
        !s.d.path()
            .join(format!("state/jobs/{id}/transcript.jsonl"))
            .exists()
    );
    let shown = s.d.run(&["runs", "show", &id, "--transcript"]);
    assert_eq!(shown.code, 1, "{}", shown.stderr);
    assert!(shown.stderr.contains("no transcript"), "{}", shown.stderr);
}

/// `runs` lists the newest first under a header, with when each ended, 50 unless told, and answers
/// the operator's filters; a filter's bad value is misuse, named by its option only.
#[test]
fn runs_lists_the_newest_first_and_filters_as_asked() {
    use records::record::{Outcome, Reason, Record};
    let d = crate::common::Deployment::new();
    assert_eq!(d.run(&["init"]).code, 0);
    let store = d.records();
    let now = records::record::now_ms();
    let day = 86_400_000;
    for (i, outcome, reason, ago) in [
        (1, Outcome::Completed, None, 3 * day),
        (2, Outcome::Failed, Some(Reason::TimeLimit), 2 * day),
        (3, Outcome::Completed, None, day / 2),
        (4, Outcome::Policy, Some(Reason::McpServerUnknown), 60_000),
    ] {
        let job = protocol::job::Job::new(format!("job-{i}"), "cron", "local");
        store
            .write(&Record::new(&job, outcome, reason, 1, now - ago))
            .unwrap();
    }
    let ids = |args: &[&str]| -> Vec<String> {
        let run = d.run(&[&["runs"][..], args].concat());
        assert_eq!(run.code, 0, "{}", run.stderr);
        run.stdout
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
            .collect()
    };
    let all = d.run(&["runs"]);
    assert!(all.stdout.starts_with("ENDED (UTC)"), "{}", all.stdout);
    assert_eq!(ids(&[]), ["job-4", "job-3", "job-2", "job-1"]);
    assert_eq!(ids(&["--limit", "2"]), ["job-4", "job-3"]);
    assert_eq!(ids(&["--outcome", "completed"]), ["job-3", "job-1"]);
    assert_eq!(ids(&["--reason", "time-limit"]), ["job-2"]);
    assert_eq!(ids(&["--since", "1d"]), ["job-4", "job-3"]);
    assert_eq!(ids(&["--trigger", "cron", "--since", "2h"]), ["job-4"]);
    let none = d.run(&["runs", "--folder", "/nowhere"]);
    assert!(none.stdout.contains("No run matches"), "{}", none.stdout);
    let json: serde_json::Value =
        serde_json::from_str(&d.run(&["runs", "--json", "--limit", "1"]).stdout).unwrap();
    assert_eq!(json[0]["jobId"], "job-4");
    for (option, value) in [
        ("--since", "3y"),
        ("--outcome", "cnry-x"),
        ("--repo", "cnry"),
    ] {
        let bad = d.run(&["runs", option, value]);
        assert_eq!(bad.code, 2, "{option}: {}", bad.stderr);
        assert!(
            bad.stderr.contains(option) && !bad.stderr.contains("cnry"),
            "{}",
            bad.stderr
        );
    }
}

/// A deployment of an earlier version kept a file a record under `state/runs`: the first command
/// that reads the records brings them into the index, names a file it cannot read, and keeps every
/// file (the folder becomes `state/runs.imported`).
#[test]
fn record_files_of_an_earlier_version_are_brought_in_once_and_kept() {
    let d = crate::common::Deployment::new();
    assert_eq!(d.run(&["init"]).code, 0);
    let job = protocol::job::Job::new("old-1", "cron", "local");
    let old = records::record::Record::new(&job, records::record::Outcome::Completed, None, 1, 5);
    d.write(
        "state/runs/old-1.json",
        &serde_json::to_string_pretty(&old).unwrap(),
    );
    d.write("state/runs/broken.json", "{ not a record");
    let run = d.run(&["runs"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("broken.json"), "{}", run.stderr);
    assert!(run.stdout.contains("old-1"), "{}", run.stdout);
    let kept = d.path().join("state/runs.imported");
    assert_eq!(
        std::fs::read_to_string(kept.join("broken.json")).unwrap(),
        "{ not a record"
    );
    assert!(kept.join("old-1.json").exists());
    assert!(!d.path().join("state/runs").exists());
    // Once: the next command reads the index only.
    let again = d.run(&["runs"]);
    assert!(!again.stderr.contains("broken.json"), "{}", again.stderr);
    assert!(again.stdout.contains("old-1"), "{}", again.stdout);
    // An unknown id is misuse (exit 2), and the message names where records are.
    let show = d.run(&["runs", "show", "nope"]);
    assert_eq!(show.code, 2, "{}", show.stderr);
    assert!(show.stderr.contains("queue.sqlite3"), "{}", show.stderr);
}

/// An answer of 1.5 MiB (pi's line for it passes the line limit) completes, as one of 700 KB
/// does: counted from what the runner still reads of the line and from the gateway, the answer
/// bounded in the record, and a marker in the transcript where the line was.
#[test]
fn a_long_answer_is_a_completed_job_with_its_answer_bounded() {
    for (size, cut) in [(700_000usize, false), (1_500_000, true)] {
        let answer = "word ".repeat(size / 5);
        let s = Service::new(
            vec![Step::text(&answer)],
            |_| json!({"everything": crate::worker::stdio(None)}),
            "",
        );
        let (id, record, _, _) = s.complete("Write a lot.", "everything");
        assert_eq!(record["turns"], 1, "{size}: {record:#}");
        let message = record["finalMessage"].as_str().unwrap();
        assert!(message.starts_with("word word"), "{size}");
        assert!(message.len() <= 16 * 1024, "{size}: {}", message.len());
        let path = s.d.path().join(format!("state/jobs/{id}/transcript.jsonl"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text.contains("\"type\":\"pi_dispatch_line_cut\""),
            cut,
            "{size}"
        );
        for line in text.lines() {
            serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// A record keeps its queued forge event (for `rerun`, up to about a MiB): `runs --json` leaves
/// it out unless asked, so fifty such records print kilobytes, not fifty mebibytes.
#[test]
fn runs_json_leaves_the_queued_events_out_unless_asked() {
    use records::record::{Outcome, Record};
    let d = crate::common::Deployment::new();
    assert_eq!(d.run(&["init"]).code, 0);
    let store = d.records();
    let now = records::record::now_ms();
    let body = "cnry-issue-text ".repeat(40_000);
    for i in 0..5 {
        let mut job = protocol::job::Job::new(format!("gh-d{i}-t0"), "label", "github");
        let mut event = protocol::forge_event::ForgeEvent::new(
            protocol::forge_event::Forge::Github,
            &format!("d{i}"),
            "octo-org/hello".to_owned(),
            7,
            "main".to_owned(),
            "maintainer".to_owned(),
        );
        event.number = 42;
        event.body = body.clone();
        job.event = Some(event);
        store
            .write(&Record::new(&job, Outcome::Completed, None, 1, now - i))
            .unwrap();
    }
    let listed = d.run(&["runs", "--json"]);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let json: Value = serde_json::from_str(&listed.stdout).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 5);
    assert!(!listed.stdout.contains("cnry-issue-text"));
    assert!(listed.stdout.len() < 64 * 1024, "{}", listed.stdout.len());
    // Asked for, the events are there; and one record's own JSON always has its event.
    let whole = d.run(&["runs", "--json", "--with-events"]);
    assert!(whole.stdout.contains("cnry-issue-text"));
    let one = d.run(&["runs", "show", "gh-d0-t0", "--json"]);
    assert!(one.stdout.contains("cnry-issue-text"), "{}", one.stderr);
}
