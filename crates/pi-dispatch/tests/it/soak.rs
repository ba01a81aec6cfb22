//! The soak: many jobs (`PI_SOAK_JOBS`, 100 unless told; `scripts/soak` runs 1,000) through two
//! workers of one deployment, on SQLite and on Redis, with real pi, bubblewrap and egress on, while
//! a fault schedule runs beside them: a worker SIGKILLed at a random point of a job's life and
//! started again, a worker SIGSTOPped (past its lease, at times), Redis restarted, the queue paused
//! (Redis stopped by SIGSTOP, the SQLite file locked by another connection), the state's disk filled
//! below `PI_DISK_MIN_MB`, the egress proxy SIGKILLed, and a model that hangs or resets for some
//! jobs. Once every job has its record and the workers have drained: every job has one final
//! record with a reason the tables allow, nothing is queued or running, nothing of a job is left
//! on the host, and the counters agree with the records. The schedule and the report are printed
//! (`--nocapture`); `PI_SOAK_SEED` repeats a schedule, `PI_SOAK_REPORT` names a file the report
//! is added to as a JSON line.

mod check;
mod faults;
mod leftovers;
mod schedule;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::fake_model::{FakeModel, Reply, Request, Step};
use testkit::netns::TestHost;
use testkit::redis::RedisServer;

use crate::common::{Deployment, Run};
use crate::disk_full::Mounted;
use crate::many_hosts::Log;
use crate::worker::{MODEL_KEY, give_to_nobody, queued_id};
use schedule::{JobKind, LEASE_SECS, Plan};

/// The state's own file system, and the free space under which no job starts.
const STATE_MIB: u64 = 768;
const DISK_MIN_MB: u64 = 256;
/// A job's time limit: what ends a job whose model hangs.
const TIME_LIMIT_SECS: u64 = 20;
/// Repositories the jobs are spread over (one job at a time in each).
const REPOS: usize = 6;
/// The most a job may be tried (the worker's two attempts).
const ATTEMPTS: u32 = 2;

/// Which queue, and the pool of ids its jobs run as (each soak its own, so that what one leaves
/// is told from the other's).
#[derive(Clone, Copy, PartialEq)]
enum Backend {
    Sqlite,
    Redis,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Redis => "redis",
        }
    }

    fn uids(self) -> (u32, u32) {
        match self {
            Backend::Sqlite => (1_879_050_000, 1_879_050_015),
            Backend::Redis => (1_879_050_016, 1_879_050_031),
        }
    }
}

/// The model every soak job talks to: by the marker in the job's task, it hangs, resets, or asks
/// for one shell command and then answers.
fn reply(request: &Request) -> Reply {
    let text = request.body.to_string();
    if text.contains(JobKind::Hang.marker()) {
        return Reply::Hang;
    }
    if text.contains(JobKind::Reset.marker()) {
        return Reply::Reset;
    }
    let continues = request.body["messages"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
    if continues {
        Reply::Step(Step::text("done"))
    } else {
        Reply::Step(Step::call(
            "bash",
            json!({"command": "echo soak >> soak.txt"}),
        ))
    }
}

/// Everything a soak runs: the deployment (its state on a file system of its own), its queue, the
/// model on a test host, and the two workers.
struct Rig {
    backend: Backend,
    /// Unmounted before the deployment's folder goes.
    _state_fs: Mounted,
    d: Deployment,
    redis: Option<Mutex<RedisServer>>,
    workers: Mutex<Vec<(Option<Child>, Log)>>,
    model: FakeModel,
    repos: Vec<PathBuf>,
    /// Dropped last: the model on it ends first.
    _peer: TestHost,
}

impl Rig {
    fn new(backend: Backend) -> Rig {
        let peer = TestHost::new();
        let model = FakeModel::serve_by(peer.tcp(0), peer.v4.into(), reply);
        let redis = (backend == Backend::Redis).then(|| RedisServer::start_with(true));
        let d = Deployment::with_image(&[]);
        let state_fs = Mounted::tmpfs(&d.path().join("state"), STATE_MIB);
        d.write("pi-global/models.json", &model.models_json("FAKE_API_KEY"));
        d.write(
            "model-endpoints.json",
            &json!({"version": 1, "endpoints": [
                {"id": "model", "host": peer.v4.to_string(), "port": model.port}]})
            .to_string(),
        );
        let (first, last) = backend.uids();
        let queue = redis
            .as_ref()
            .map_or(String::new(), |r| format!("PI_QUEUE={}\n", r.url()));
        d.write(
            ".env",
            &format!(
                "PI_PROVIDER=fake\nPI_MODEL=fake-model\nPI_WORKER_CONCURRENCY=2\n\
                 PI_JOB_TIME_LIMIT={TIME_LIMIT_SECS}\nPI_JOB_UIDS={first}-{last}\nPI_JOB_DISK_MB=64\n\
                 PI_DISK_WARN_MB={}\nPI_DISK_MIN_MB={DISK_MIN_MB}\nPI_WORKER_HEARTBEAT_SECS=1\n{queue}",
                DISK_MIN_MB + 128
            ),
        );
        let repos = (0..REPOS).map(|n| repository(d.path(), n)).collect();
        Rig {
            backend,
            _state_fs: state_fs,
            d,
            redis: redis.map(Mutex::new),
            workers: Mutex::new(vec![(None, Log::default()), (None, Log::default())]),
            model,
            repos,
            _peer: peer,
        }
    }

    fn state(&self) -> PathBuf {
        self.d.path().join("state")
    }

    fn cli(&self, args: &[&str]) -> Run {
        let mut cmd = self.d.command(args);
        cmd.env("FAKE_API_KEY", MODEL_KEY);
        Run::from(cmd.output().unwrap())
    }

    /// Starts worker `n` (again), its log added to what it logged before.
    fn start_worker(&self, n: usize) {
        let lease = LEASE_SECS.to_string();
        let mut cmd = self.d.command(&[
            "worker",
            "--poll-ms",
            "100",
            "--lease",
            &lease,
            "--log-format",
            "json",
        ]);
        cmd.env("FAKE_API_KEY", MODEL_KEY)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let log = self.workers.lock().unwrap()[n].1.clone();
        log.follow(child.stderr.take().unwrap());
        self.workers.lock().unwrap()[n].0 = Some(child);
    }

    fn worker_pid(&self, n: usize) -> Option<u32> {
        self.workers.lock().unwrap()[n].0.as_ref().map(Child::id)
    }

    fn logs(&self) -> Vec<Log> {
        let workers = self.workers.lock().unwrap();
        workers.iter().map(|(_, l)| l.clone()).collect()
    }

    /// Queues every job of the plan (four at a time, as several triggers would); their ids in order.
    fn queue(&self, plan: &Plan) -> Vec<String> {
        let per = plan.jobs.len().div_ceil(4);
        std::thread::scope(|scope| {
            let handles: Vec<_> = plan
                .jobs
                .chunks(per)
                .enumerate()
                .map(|(t, chunk)| {
                    scope.spawn(move || {
                        chunk
                            .iter()
                            .enumerate()
                            .map(|(i, kind)| self.queue_one(t * per + i, *kind))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        })
    }

    fn queue_one(&self, n: usize, kind: JobKind) -> String {
        let repo = self.repos[n % REPOS].to_str().unwrap().to_owned();
        let task = format!("Soak job {n} ({}).", kind.marker());
        let run = self.cli(&["run", &repo, "--task", &task]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        queued_id(&run)
    }

    fn records(&self) -> records::store::Records {
        match &self.redis {
            None => self.d.records(),
            Some(redis) => {
                let target = queue::RedisTarget {
                    url: redis.lock().unwrap().url(),
                    password: None,
                };
                records::store::Records::redis(std::sync::Arc::new(
                    queue::RedisQueue::open(&target).unwrap(),
                ))
            }
        }
    }

    /// Stops both workers as an operator would (SIGTERM: they drain), and waits for them.
    fn stop_workers(&self) {
        for n in 0..2 {
            if let Some(pid) = self.worker_pid(n) {
                faults::signal(pid, "TERM");
            }
        }
        for n in 0..2 {
            let child = self.workers.lock().unwrap()[n].0.take();
            if let Some(mut child) = child {
                let status = faults::wait_bounded(&mut child, Duration::from_secs(60));
                assert!(
                    status.is_some_and(|s| s.success()),
                    "worker {n} did not drain: {status:?}"
                );
            }
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Ok(mut workers) = self.workers.lock() {
            for (child, _) in workers.iter_mut() {
                if let Some(mut c) = child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
        }
    }
}

/// A repository the jobs work in, the job user's.
fn repository(dir: &Path, n: usize) -> PathBuf {
    let repo = dir.join(format!("repos/r{n}"));
    std::fs::create_dir_all(&repo).unwrap();
    crate::common::git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("README.md"), format!("repository {n}\n")).unwrap();
    crate::common::git(&repo, &["add", "."]);
    crate::common::git(&repo, &["commit", "-qm", "init"]);
    give_to_nobody(&repo);
    repo
}

/// The soak's size and seed, from the environment.
fn plan(backend: Backend) -> Plan {
    let jobs = std::env::var("PI_SOAK_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100usize)
        .max(20);
    let seed = std::env::var("PI_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    Plan::draw(seed, jobs, backend == Backend::Redis)
}

/// Waits until every job has its final record; the records, by job.
fn wait_for_every_record(
    rig: &Rig,
    ids: &[String],
    within: Duration,
) -> BTreeMap<String, records::record::Record> {
    let store = rig.records();
    let start = Instant::now();
    let mut done = BTreeMap::new();
    loop {
        for id in ids {
            if !done.contains_key(id)
                && let Ok(r) = store.read(id)
            {
                done.insert(id.clone(), r);
            }
        }
        if done.len() == ids.len() {
            return done;
        }
        if start.elapsed() > within {
            let status = rig.cli(&["status"]);
            panic!(
                "{} of {} jobs have no record after {within:?}\n{}",
                ids.len() - done.len(),
                ids.len(),
                status.stdout
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn soak(backend: Backend) {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: the soak mounts the state's own file system, which takes root");
        return;
    }
    let plan = plan(backend);
    eprint!("{}", plan.describe(backend.name()));
    let rig = Rig::new(backend);
    let started = Instant::now();
    let ids = rig.queue(&plan);
    rig.start_worker(0);
    rig.start_worker(1);
    let finished = AtomicBool::new(false);
    let (records, ran) = std::thread::scope(|scope| {
        let faults = scope.spawn(|| faults::run(&rig, &plan, &finished));
        let within = Duration::from_secs(300 + 3 * ids.len() as u64);
        let records = wait_for_every_record(&rig, &ids, within);
        finished.store(true, Ordering::SeqCst);
        (records, faults.join().unwrap())
    });
    let elapsed = started.elapsed();
    let status = rig.cli(&["status", "--json"]);
    rig.stop_workers();
    let report = check::all(&rig, &plan, &ids, &records, &ran, &status);
    eprintln!("{}", report.text(backend.name(), elapsed));
    if let Ok(path) = std::env::var("PI_SOAK_REPORT") {
        let line = report.json(backend.name(), &plan, elapsed).to_string() + "\n";
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        file.write_all(line.as_bytes()).unwrap();
    }
    report.assert_clean();
}

#[test]
fn two_workers_on_sqlite_keep_every_promise_through_a_fault_schedule() {
    soak(Backend::Sqlite);
}

#[test]
fn two_workers_on_redis_keep_every_promise_through_a_fault_schedule() {
    soak(Backend::Redis);
}

/// The model's part: a job whose model hangs is held, not answered; a reset one gets no answer.
#[test]
fn the_soak_model_answers_by_the_jobs_marker() {
    let kind = |task: &str, tool: bool| {
        let mut messages = vec![json!({"role": "user", "content": task})];
        if tool {
            messages.push(json!({"role": "tool", "content": "ok"}));
        }
        let request = Request {
            path: "/v1/chat/completions".into(),
            authorization: None,
            headers: Vec::new(),
            body: json!({"messages": messages}),
            at: Instant::now(),
        };
        match reply(&request) {
            Reply::Hang => "hang",
            Reply::Reset => "reset",
            Reply::Step(Step::Call(..)) => "call",
            Reply::Step(Step::Text(..)) => "text",
            Reply::Step(_) => "other",
        }
    };
    assert_eq!(kind("Soak job 1 (SOAK-HANG).", false), "hang");
    assert_eq!(kind("Soak job 1 (SOAK-RESET).", true), "reset");
    assert_eq!(kind("Soak job 1 (SOAK-NORMAL).", false), "call");
    assert_eq!(kind("Soak job 1 (SOAK-NORMAL).", true), "text");
}
