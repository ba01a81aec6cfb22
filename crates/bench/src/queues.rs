//! The queue's two backends side by side (`--queues`): the same jobs enqueued into a fresh SQLite
//! file and a fresh Redis (Debian's redis-server on a unix socket, its append-only file synced before
//! every answer, as durable as SQLite's `synchronous=FULL`, and synced once a second, as Redis
//! advises), then drained by 1, 2 and 4 workers, each a
//! thread with its own handle (its own connection), leasing, holding the job for the runner's time,
//! and finishing it. Two runners: one that does nothing (what the queue alone costs) and one that
//! holds each job 5 ms (a job that takes time, as every real one does). Every job must be finished
//! exactly once, or the bench fails.

use std::collections::HashMap;
use std::sync::Barrier;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, ensure};
use queue::{Queue, RedisQueue, RedisTarget, SqliteQueue};
use serde_json::{Value, json};

const LEASE: Duration = Duration::from_secs(600);
pub const WORKERS: [u32; 3] = [1, 2, 4];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    /// The append-only file synced before every answer: as durable as SQLite's FULL.
    Redis,
    /// Synced once a second, Redis's own advice: a crash of Redis may lose the last second.
    RedisEverysec,
}

const BACKENDS: [Backend; 3] = [Backend::Sqlite, Backend::Redis, Backend::RedisEverysec];

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Redis => "redis",
            Backend::RedisEverysec => "redis-everysec",
        }
    }
}

/// One backend, one runner, one number of workers.
pub struct Row {
    backend: Backend,
    hold: Duration,
    workers: u32,
    jobs: usize,
    enqueue: Duration,
    drain: Duration,
}

pub struct QueuesFigures {
    rows: Vec<Row>,
}

/// A fresh store of `backend`: its handles, and what keeps it alive.
struct Store {
    open: Box<dyn Fn() -> anyhow::Result<Box<dyn Queue>>>,
    _keep: Box<dyn std::any::Any>,
}

fn store(backend: Backend) -> anyhow::Result<Store> {
    Ok(match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
            let path = dir.path().join("state/queue.sqlite3");
            Store {
                open: Box::new(move || Ok(Box::new(SqliteQueue::open(&path)?) as Box<dyn Queue>)),
                _keep: Box::new(dir),
            }
        }
        Backend::Redis | Backend::RedisEverysec => {
            let server =
                testkit::redis::RedisServer::start_with_fsync(if backend == Backend::Redis {
                    "always"
                } else {
                    "everysec"
                });
            let target = RedisTarget {
                url: server.url(),
                password: None,
            };
            Store {
                open: Box::new(move || Ok(Box::new(RedisQueue::open(&target)?) as Box<dyn Queue>)),
                _keep: Box::new(server),
            }
        }
    })
}

fn run_one(
    backend: Backend,
    jobs: &[(String, String)],
    workers: u32,
    hold: Duration,
) -> anyhow::Result<Row> {
    let store = store(backend)?;
    let queue = (store.open)()?;
    let enqueue = crate::queue::enqueue_all(&*queue, jobs)?;
    let handles = (0..workers)
        .map(|_| (store.open)())
        .collect::<anyhow::Result<Vec<_>>>()?;
    let barrier = Barrier::new(handles.len() + 1);
    let (finished, drain) = std::thread::scope(|scope| {
        let threads: Vec<_> = handles
            .into_iter()
            .enumerate()
            .map(|(w, q)| {
                let barrier = &barrier;
                scope.spawn(move || -> anyhow::Result<Vec<String>> {
                    let name = format!("bench-{w}");
                    let mut done = Vec::new();
                    barrier.wait();
                    while let Some(lease) = q.lease(&name, LEASE, SystemTime::now())? {
                        if !hold.is_zero() {
                            std::thread::sleep(hold);
                        }
                        ensure!(
                            q.finish(&lease, SystemTime::now())?,
                            "{name} lost its lease"
                        );
                        done.push(lease.job_id);
                    }
                    Ok(done)
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let finished = threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a worker panicked")))
            })
            .collect::<anyhow::Result<Vec<_>>>();
        (finished, start.elapsed())
    });
    let mut times: HashMap<String, usize> = HashMap::new();
    for id in finished?.into_iter().flatten() {
        *times.entry(id).or_default() += 1;
    }
    ensure!(
        times.len() == jobs.len() && times.values().all(|n| *n == 1),
        "{}: {} workers finished {} distinct jobs of {}, some more than once",
        backend.name(),
        workers,
        times.len(),
        jobs.len()
    );
    let status = queue.status(SystemTime::now(), 0)?;
    ensure!(
        status.open.is_empty() && status.counts.done == jobs.len(),
        "the queue is not drained"
    );
    Ok(Row {
        backend,
        hold,
        workers,
        jobs: jobs.len(),
        enqueue,
        drain,
    })
}

/// Every backend with every number of workers: `jobs` with the no-op runner, the first
/// `held` of them with the 5 ms one.
pub fn measure(jobs: &[(String, String)], held: usize) -> anyhow::Result<QueuesFigures> {
    let mut rows = Vec::new();
    for (hold, jobs) in [
        (Duration::ZERO, jobs),
        (Duration::from_millis(5), &jobs[..held.min(jobs.len())]),
    ] {
        for workers in WORKERS {
            // Taking turns, so that both backends see the machine alike.
            for backend in BACKENDS {
                rows.push(run_one(backend, jobs, workers, hold)?);
            }
        }
    }
    Ok(QueuesFigures { rows })
}

fn rate(jobs: usize, d: Duration) -> f64 {
    jobs as f64 / d.as_secs_f64()
}

impl QueuesFigures {
    fn drain_rate(&self, backend: Backend, hold: Duration, workers: u32) -> f64 {
        self.rows
            .iter()
            .find(|r| r.backend == backend && r.hold == hold && r.workers == workers)
            .map_or(0.0, |r| rate(r.jobs, r.drain))
    }

    /// For each runner and Redis: 4 workers against 1, and one Redis worker against one SQLite.
    fn goals(&self) -> Vec<(Duration, Backend, f64, f64)> {
        let mut out = Vec::new();
        for hold in [Duration::ZERO, Duration::from_millis(5)] {
            for redis in [Backend::Redis, Backend::RedisEverysec] {
                let r1 = self.drain_rate(redis, hold, 1);
                out.push((
                    hold,
                    redis,
                    self.drain_rate(redis, hold, 4) / r1,
                    r1 / self.drain_rate(Backend::Sqlite, hold, 1),
                ));
            }
        }
        out
    }

    pub fn json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "backend": r.backend.name(),
                    "runner_ms": r.hold.as_millis(),
                    "workers": r.workers,
                    "jobs": r.jobs,
                    "enqueue_jobs_per_s": rate(r.jobs, r.enqueue).round(),
                    "drain_jobs_per_s": rate(r.jobs, r.drain).round(),
                    "each_finished_once": true,
                })
            })
            .collect();
        let goals: Vec<Value> = self
            .goals()
            .into_iter()
            .map(|(hold, redis, scale, versus)| {
                json!({
                    "runner_ms": hold.as_millis(),
                    "redis": redis.name(),
                    "redis_4_against_1": (scale * 100.0).round() / 100.0,
                    "redis_1_against_sqlite_1": (versus * 100.0).round() / 100.0,
                    "within_goal": scale >= 3.0 && versus >= 1.0,
                })
            })
            .collect();
        json!({"rows": rows, "goals": goals})
    }

    pub fn print(&self) {
        for r in &self.rows {
            println!(
                "queues: {:6} runner {} ms, {} workers: {} jobs enqueued at {:.0} jobs/s, drained at {:.0} jobs/s; each finished once",
                r.backend.name(),
                r.hold.as_millis(),
                r.workers,
                r.jobs,
                rate(r.jobs, r.enqueue),
                rate(r.jobs, r.drain)
            );
        }
        for (hold, redis, scale, versus) in self.goals() {
            println!(
                "queues goal, runner {} ms, {}: Redis 4 workers drain at {scale:.2}x 1 worker (goal 3x); one Redis worker at {versus:.2}x one SQLite worker (goal 1x): {}",
                hold.as_millis(),
                redis.name(),
                if scale >= 3.0 && versus >= 1.0 {
                    "within"
                } else {
                    "OVER"
                }
            );
        }
    }
}
