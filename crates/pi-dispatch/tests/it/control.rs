//! The operator in control, with real sandboxes and real pi: cancelling a queued or a running job,
//! draining a worker on SIGTERM (jobs let finish, or handed back to the queue), one job at a time
//! in a repository folder, and `status` saying what runs where and what was lost.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::fake_model::Step;

use crate::common::{Run, processes_with};
use crate::worker::{Service, stdio};

fn service(script: Vec<Step>, env: &str) -> Service {
    Service::new(script, |_| json!({"direct": stdio(None)}), env)
}

/// A worker that runs until told to stop, its log kept.
fn start_worker(s: &Service, extra: &[&str]) -> Child {
    let mut args = vec!["worker", "--poll-ms", "100"];
    args.extend_from_slice(extra);
    let mut cmd = s.d.command(&args);
    cmd.env("FAKE_API_KEY", crate::worker::MODEL_KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().unwrap()
}

/// Waits until `done` holds, at most `limit`.
fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < until, "{what} did not happen");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the model was asked `n` times.
fn asked(s: &Service, n: usize) {
    wait_for(Duration::from_secs(60), "the model's request", || {
        s.model.requests().len() >= n
    });
}

/// Waits until the job's pi runs its `sleep 120`.
fn sleeping(id: &str) {
    wait_for(Duration::from_secs(10), "pi's sleep", || {
        processes_with(id, 0)
            .iter()
            .any(|(_, cmd)| cmd.contains("sleep 120"))
    });
}

fn signal(child: &Child, signal: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

fn finish(child: Child) -> Run {
    Run::from(child.wait_with_output().unwrap())
}

fn status_json(s: &Service) -> Value {
    let run = s.d.run(&["status", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    serde_json::from_str(&run.stdout).unwrap()
}

fn records(s: &Service) -> usize {
    if !s.d.path().join("state/queue.sqlite3").exists() {
        return 0;
    }
    s.d.record_count() as usize
}

#[test]
fn a_queued_job_is_cancelled_at_once_and_an_unknown_one_is_misuse() {
    let s = service(vec![Step::text("done")], "");
    let id = s.queue("Never mind.", "direct");
    let cancel = s.d.run(&["cancel", &id]);
    assert_eq!(cancel.code, 0, "{}", cancel.stderr);
    assert!(
        cancel.stdout.contains("had not started"),
        "{}",
        cancel.stdout
    );
    let record = s.record(&id);
    assert_eq!(record["outcome"], "cancelled", "{record:#}");
    assert_eq!(record["reason"], "cancelled");
    assert_eq!(record["budgetReserved"], false);
    let again = s.d.run(&["cancel", &id]);
    assert_eq!(again.code, 1, "{}", again.stderr);
    assert!(again.stderr.contains("done already"), "{}", again.stderr);
    assert_eq!(s.d.run(&["cancel", "no-such-job"]).code, 2);
    // The worker has nothing to run, and the model was never asked.
    s.work();
    assert!(s.model.requests().is_empty());
    assert_eq!(status_json(&s)["counts"]["queued"], 0);
}

#[test]
fn a_running_job_is_cancelled_with_its_whole_tree_and_status_shows_it_running_first() {
    let s = service(
        vec![Step::call("bash", json!({"command": "sleep 120"}))],
        "PI_ON_FAILURE=page.sh\n",
    );
    let paged = s.d.path().join("paged.txt");
    let page = s.d.write(
        "page.sh",
        &format!("#!/bin/sh\necho \"$@\" >> {}\n", paged.display()),
    );
    crate::worker::chmod(&page, 0o755);
    let id = s.queue("Take the first line.\nNot this one.", "direct");
    let worker = start_worker(&s, &[]);
    asked(&s, 1);
    sleeping(&id);
    // status: running, where, on what, for how long.
    let status = status_json(&s);
    assert_eq!(status["counts"]["running"], 1, "{status:#}");
    let job = &status["open"][0];
    assert_eq!(job["id"], id.as_str());
    assert_eq!(job["state"], "running", "{status:#}");
    assert_eq!(job["task"], "Take the first line.");
    assert_eq!(job["folder"], s.repo.to_str().unwrap());
    assert!(job["runningSecs"].is_u64(), "{status:#}");
    assert!(job["worker"].as_str().unwrap().contains(':'), "{status:#}");
    let human = s.d.run(&["status"]);
    assert!(
        human.stdout.contains("running on ") && human.stdout.contains("task: Take the first line."),
        "{}",
        human.stdout
    );

    let asked_at = Instant::now();
    let cancel = s.d.run(&["cancel", &id]);
    assert_eq!(cancel.code, 0, "{}", cancel.stderr);
    wait_for(
        Duration::from_secs(5),
        "the end of every job process",
        || processes_with(&id, 0).is_empty(),
    );
    let stopped_in = asked_at.elapsed();
    assert!(
        stopped_in < Duration::from_secs(5),
        "stopped in {stopped_in:?}"
    );
    wait_for(Duration::from_secs(5), "the record", || {
        s.d.record(&id).is_some()
    });
    let record = s.record(&id);
    assert_eq!(record["outcome"], "cancelled", "{record:#}");
    assert_eq!(record["reason"], "cancelled");
    assert_eq!(record["budgetReserved"], true);
    assert_eq!(record["spent"], true, "{record:#}");
    // The operator's own stop pages nobody.
    assert!(!paged.exists(), "PI_ON_FAILURE ran for a cancel");
    // The worker goes on; told to stop, it exits 0.
    signal(&worker, "TERM");
    let run = finish(worker);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(records(&s), 1);
}

#[test]
fn sigterm_drains_and_hands_back_what_outlasts_the_limit() {
    let s = service(
        vec![
            // The first run sleeps past the drain limit ...
            Step::call("bash", json!({"command": "sleep 120"})),
            // ... and the run after the hand-back finishes.
            Step::text("done"),
        ],
        "PI_WORKER_DRAIN_LIMIT=2\n",
    );
    let id = s.queue("Sleep.", "direct");
    let worker = start_worker(&s, &[]);
    asked(&s, 1);
    sleeping(&id);
    let told = Instant::now();
    signal(&worker, "TERM");
    let run = finish(worker);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        told.elapsed() < Duration::from_secs(20),
        "{:?}",
        told.elapsed()
    );
    assert!(run.stdout.contains("1 jobs handed back"), "{}", run.stdout);
    assert!(run.stderr.contains("worker_draining"), "{}", run.stderr);
    assert_eq!(processes_with(&id, 0), vec![]);
    // Handed back at once, not after a lease lapses: queued again, the attempt not counted, no
    // record.
    assert_eq!(records(&s), 0);
    let status = status_json(&s);
    assert_eq!(status["open"][0]["state"], "queued", "{status:#}");
    assert_eq!(status["open"][0]["attempt"], 0, "{status:#}");
    // The next worker runs it once more, as its first attempt.
    s.work();
    let record = s.record(&id);
    assert_eq!(record["outcome"], "completed", "{record:#}");
    assert_eq!(record["attempt"], 1);
    assert_eq!(records(&s), 1);
}

#[test]
fn sigterm_lets_a_short_job_finish_takes_no_new_one_and_a_second_signal_stops_at_once() {
    let s = service(
        vec![
            Step::call("bash", json!({"command": "sleep 3"})),
            Step::text("done"),
            Step::call("bash", json!({"command": "sleep 120"})),
        ],
        "",
    );
    let first = s.queue("Sleep a little.", "direct");
    let worker = start_worker(&s, &[]);
    asked(&s, 1);
    // A second job, queued while the first runs.
    let second = s.queue("Wait your turn.", "direct");
    signal(&worker, "TERM");
    let run = finish(worker);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(s.record(&first)["outcome"], "completed");
    assert_eq!(records(&s), 1);
    let status = status_json(&s);
    assert_eq!(status["open"][0]["id"], second.as_str(), "{status:#}");
    assert_eq!(status["open"][0]["state"], "queued", "{status:#}");

    // The second job sleeps long; two signals stop the worker at once, the job handed back.
    let worker = start_worker(&s, &[]);
    asked(&s, 3);
    sleeping(&second);
    let told = Instant::now();
    signal(&worker, "TERM");
    std::thread::sleep(Duration::from_millis(300));
    signal(&worker, "INT");
    let run = finish(worker);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        told.elapsed() < Duration::from_secs(15),
        "{:?}",
        told.elapsed()
    );
    assert!(run.stdout.contains("1 jobs handed back"), "{}", run.stdout);
    assert_eq!(processes_with(&second, 0), vec![]);
    assert_eq!(records(&s), 1);
}

#[test]
fn two_jobs_for_one_folder_run_one_after_the_other() {
    let s = service(
        vec![
            Step::call("bash", json!({"command": "sleep 3"})),
            Step::text("done"),
            Step::text("done"),
        ],
        "",
    );
    let a = s.queue("First.", "direct");
    let b = s.queue("Second.", "direct");
    let run = Run::from(s.worker_command(&["--concurrency", "2"]).output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("job_waits_for_folder"),
        "{}",
        run.stderr
    );
    let (ra, rb) = (s.record(&a), s.record(&b));
    assert_eq!(ra["outcome"], "completed", "{ra:#}");
    assert_eq!(rb["outcome"], "completed", "{rb:#}");
    let span = |r: &Value| {
        (
            r["startedAtMs"].as_u64().unwrap(),
            r["finishedAtMs"].as_u64().unwrap(),
        )
    };
    let ((a0, a1), (b0, b1)) = (span(&ra), span(&rb));
    assert!(
        a1 <= b0 || b1 <= a0,
        "the jobs overlapped: {a0}..{a1} and {b0}..{b1}"
    );
}

#[test]
fn a_dead_workers_job_shows_as_lost_not_running() {
    let s = service(
        vec![Step::call("bash", json!({"command": "sleep 120"}))],
        "",
    );
    let id = s.queue("Sleep.", "direct");
    let mut worker = start_worker(&s, &["--lease", "2"]);
    asked(&s, 1);
    worker.kill().unwrap();
    worker.wait().unwrap();
    wait_for(
        Duration::from_secs(10),
        "the end of the job's processes",
        || processes_with(&id, 0).is_empty(),
    );
    wait_for(Duration::from_secs(10), "the lease to lapse", || {
        status_json(&s)["open"][0]["state"] == "lost"
    });
    let status = status_json(&s);
    assert_eq!(status["counts"]["lost"], 1, "{status:#}");
    assert_eq!(status["counts"]["running"], 0, "{status:#}");
    let human = s.d.run(&["status"]);
    assert!(human.stdout.contains("lost: "), "{}", human.stdout);
}
