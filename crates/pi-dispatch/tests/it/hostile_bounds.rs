//! A hijacked job against the host's resources, in real jobs through the worker: pi's bash tool
//! forks without end, allocates without end, fills its `/tmp`, and spins on the CPU. The kernel
//! keeps each bound (the job's control groups), the worker ends the job with the bound's own
//! reason and names the limit in the record, and it then takes the next job, which completes.

use serde_json::json;
use testkit::fake_model::Step;

use crate::worker::{Service, queued_id, stdio};

/// Runs `attack` as a job under `env`'s bounds, then a plain job; returns the first job's record
/// once both are done, and insists the second completed.
fn attacked(attack: &str, env: &str) -> serde_json::Value {
    let s = Service::new(
        vec![
            Step::call("bash", json!({"command": attack})),
            Step::text("the next job is done"),
        ],
        |_| json!({"everything": stdio(Some("direct"))}),
        env,
    );
    let first = s.queue("Use the machine.", "everything");
    let run = s.cli(&[
        "run",
        s.repo.to_str().unwrap(),
        "--task",
        "Say done.",
        "--force",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let second = queued_id(&run);
    let started = std::time::Instant::now();
    let worked = s.work();
    // The worker recorded the bounded job and ran the next one, all within the test's run.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(120),
        "{}",
        worked.stderr
    );
    let next = s.record(&second);
    assert_eq!(next["outcome"], "completed", "{next:#}\n{}", worked.stderr);
    s.record(&first)
}

fn ended_for(record: &serde_json::Value, reason: &str, setting: &str) {
    assert_eq!(record["reason"], reason, "{record:#}");
    assert_eq!(record["outcome"], "failed", "{record:#}");
    assert_eq!(
        record["detail"]["variables"],
        json!([setting]),
        "{record:#}"
    );
}

#[test]
fn a_fork_bomb_ends_its_job_at_the_process_limit() {
    let record = attacked(
        "for i in $(seq 400); do sleep 120 & done; wait",
        "PI_JOB_PIDS=128\n",
    );
    ended_for(&record, "job-pids-limit", "PI_JOB_PIDS");
    let why = record["detail"]["why"].as_str().unwrap();
    assert!(why.contains("128 processes"), "{why}");
}

#[test]
fn a_memory_bomb_ends_its_job_at_the_memory_limit() {
    let record = attacked(
        "node -e 'const a = []; for (;;) a.push(Buffer.alloc(1 << 20, 1))'",
        "PI_JOB_MEMORY_MB=640\n",
    );
    ended_for(&record, "job-memory-limit", "PI_JOB_MEMORY_MB");
    let why = record["detail"]["why"].as_str().unwrap();
    assert!(why.contains("640 MiB"), "{why}");
}

#[test]
fn filling_tmp_ends_its_job_at_the_memory_limit() {
    let record = attacked(
        "head -c 2000M /dev/zero > /tmp/fill; ls -l /tmp/fill",
        "PI_JOB_MEMORY_MB=640\n",
    );
    ended_for(&record, "job-memory-limit", "PI_JOB_MEMORY_MB");
}

#[test]
fn spinning_ends_its_job_at_the_cpu_limit() {
    let record = attacked(
        "for i in 1 2 3 4; do (while :; do :; done) & done; sleep 100",
        "PI_JOB_CPU_SECS=20\n",
    );
    ended_for(&record, "job-cpu-limit", "PI_JOB_CPU_SECS");
}
