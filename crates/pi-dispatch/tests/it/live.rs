//! A job watched while it runs: real pi in bubblewrap, a real MCP server, the scripted model. From
//! another process, `runs show ID` says where the job stands (queued, then running, with its
//! server and what pi began), and `runs show ID --follow` streams its transcript as the worker
//! writes it, then its record. A secret the job's server holds, which the agent reads and the
//! transcript would carry, never shows: the live view is redacted as the transcript is.

use std::io::{BufRead as _, BufReader};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::fake_model::Step;

use crate::common::Run;
use crate::worker::{EVERYTHING, MODEL_KEY, Service};

const TOKEN: &str = "cnry-live-token-5e1a";

/// Lines a process printed, each with when it came (Unix ms).
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<(u64, String)>>>);

impl Lines {
    fn first(&self, wanted: impl Fn(&str) -> bool) -> Option<(u64, String)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|(_, l)| wanted(l))
            .cloned()
    }

    fn text(&self) -> String {
        let lines = self.0.lock().unwrap();
        lines.iter().map(|(_, l)| format!("{l}\n")).collect()
    }
}

fn now_ms() -> u64 {
    records::record::now_ms()
}

/// `cmd`'s standard output, read line by line as it comes, into the lines returned.
fn read_lines(cmd: &mut std::process::Command) -> (std::process::Child, Lines) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let lines = Lines::default();
    let keep = lines.clone();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            keep.0.lock().unwrap().push((now_ms(), line));
        }
    });
    (child, lines)
}

#[test]
fn a_running_job_is_followed_from_another_process_and_shows_no_secret() {
    let s = Service::new(
        vec![
            Step::call("mcp__vault__get_env", json!({})),
            Step::call("bash", json!({"command": "sleep 4; echo slept"})),
            Step::text("Done: slept."),
        ],
        |_| {
            json!({"vault": {"command": "node", "args": [EVERYTHING, "stdio"],
                "env": {"DOCS_TOKEN": "${DOCS_TOKEN}"}, "description": "Sees a secret", "exposure": "direct"}})
        },
        "PI_FORWARD_ENV=DOCS_TOKEN\n",
    );
    s.seal();
    let mut run = s.d.command(&[
        "run",
        s.repo.to_str().unwrap(),
        "--task",
        "Look around, then wait.",
        "--mcp",
        "vault",
    ]);
    run.env("FAKE_API_KEY", MODEL_KEY).env("DOCS_TOKEN", TOKEN);
    let run = Run::from(run.output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = crate::worker::queued_id(&run);

    // Queued: `runs show` says so (not "no such record").
    let shown = s.d.run(&["runs", "show", &id]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert!(
        shown.stdout.starts_with(&format!("{id}: queued "))
            && shown.stdout.contains("waiting for a worker"),
        "{}",
        shown.stdout
    );
    // An id that is nowhere is still an error.
    let nowhere = s.d.run(&["runs", "show", "no-such-job"]);
    assert_eq!(nowhere.code, 2, "{}", nowhere.stdout);
    assert!(
        nowhere.stderr.contains("no job has the id no-such-job"),
        "{}",
        nowhere.stderr
    );

    // Followed from another process, before the worker starts.
    let (mut follower, followed) = read_lines(&mut s.d.command(&["runs", "show", &id, "--follow"]));
    let mut worker = s.worker_command(&[]);
    worker
        .env("DOCS_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut worker = worker.spawn().unwrap();

    // The bash call (4 s of sleep) arrives while the job runs.
    let deadline = Instant::now() + Duration::from_secs(90);
    let (tool_seen, _) = loop {
        if let Some(found) = followed.first(|l| {
            l.contains("\"type\":\"tool_execution_start\"") && l.contains("\"toolName\":\"bash\"")
        }) {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "the tool call never showed:\n{}",
            followed.text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // Looked at while it runs: running, its server ready, what pi began, and no secret.
    let shown = s.d.run(&["runs", "show", &id]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    for wanted in [
        "running on ",
        "phase: running",
        "server vault: ready",
        "so far (as pi says): ",
        "bash 1",
    ] {
        assert!(
            shown.stdout.contains(wanted),
            "{wanted} not in:\n{}",
            shown.stdout
        );
    }
    let as_json = s.d.run(&["runs", "show", &id, "--json"]);
    let live: Value = serde_json::from_str(&as_json.stdout).unwrap();
    assert_eq!(live["open"]["state"], "running", "{live:#}");
    assert_eq!(live["live"]["servers"][0]["name"], "vault", "{live:#}");
    assert!(live["liveLines"].as_u64().unwrap() > 0, "{live:#}");
    for text in [&shown.stdout, &as_json.stdout] {
        assert!(!text.contains(TOKEN) && !text.contains(MODEL_KEY), "{text}");
    }

    assert!(worker.wait().unwrap().success());
    let status = follower.wait().unwrap();
    assert!(status.success(), "{}", followed.text());
    // Where it stood went to standard error as it changed: queued, running, ended.
    let mut said = String::new();
    std::io::Read::read_to_string(&mut follower.stderr.take().unwrap(), &mut said).unwrap();
    for wanted in ["queued ", "running on ", &format!("{id} ended: completed")] {
        assert!(said.contains(wanted), "{wanted} not in:\n{said}");
    }
    let record = s.record(&id);
    assert_eq!(record["outcome"], "completed", "{record:#}");
    // The tool call was seen at least 2 s before the job ended (it then slept 4 s).
    let finished = record["finishedAtMs"].as_u64().unwrap();
    assert!(
        tool_seen + 2000 < finished,
        "seen at {tool_seen}, ended at {finished}"
    );
    // The whole transcript came, redacted, then the record.
    let all = followed.text();
    assert!(
        all.contains("[redacted:DOCS_TOKEN]"),
        "the secret was never read:\n{all}"
    );
    assert!(!all.contains(TOKEN) && !all.contains(MODEL_KEY), "{all}");
    let transcript =
        std::fs::read_to_string(s.d.path().join(format!("state/jobs/{id}/transcript.jsonl")))
            .unwrap();
    assert!(
        all.starts_with(&transcript),
        "the followed lines are not the transcript:\n{all}"
    );
    assert!(
        all[transcript.len()..].starts_with(&format!("job {id}  completed")),
        "{all}"
    );
}
