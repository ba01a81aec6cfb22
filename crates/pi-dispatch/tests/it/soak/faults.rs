//! Carrying out the soak's fault schedule beside the jobs: each fault once its share of the jobs
//! has a record, one after the other.

use std::io::Write as _;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::schedule::{Fault, Plan};
use super::{DISK_MIN_MB, Rig};

/// A fault that ran, and what it met.
#[derive(Debug, Clone)]
pub struct Ran {
    pub fault: Fault,
    /// Whether it met what it was for (a worker with a job, a proxy that answered); it ran
    /// either way.
    pub note: String,
}

/// Runs `plan`'s faults in order until they are all done (or the jobs are, `finished`).
pub fn run(rig: &Rig, plan: &Plan, finished: &AtomicBool) -> Vec<Ran> {
    let mut ran = Vec::new();
    for (at, fault) in &plan.faults {
        while recorded(rig) < *at && !finished.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
        }
        if finished.load(Ordering::SeqCst) {
            break;
        }
        let note = apply(rig, *fault);
        eprintln!(
            "soak: {} at {} records: {note}",
            fault.kind(),
            recorded(rig)
        );
        ran.push(Ran {
            fault: *fault,
            note,
        });
    }
    ran
}

/// Records written so far, by the workers' logs.
fn recorded(rig: &Rig) -> usize {
    rig.logs().iter().map(|l| l.count("job_recorded")).sum()
}

fn apply(rig: &Rig, fault: Fault) -> String {
    match fault {
        Fault::KillWorker { worker, after_ms } => kill_worker(rig, worker, after_ms),
        Fault::StopWorker { worker, for_ms } => {
            let Some(pid) = rig.worker_pid(worker) else {
                return "no worker".into();
            };
            signal(pid, "STOP");
            std::thread::sleep(Duration::from_millis(for_ms));
            signal(pid, "CONT");
            format!("worker {worker} stopped for {for_ms} ms")
        }
        Fault::RestartQueue { down_ms } => {
            let redis = rig
                .redis
                .as_ref()
                .expect("a restart is drawn for Redis only");
            redis.lock().unwrap().stop();
            std::thread::sleep(Duration::from_millis(down_ms));
            redis.lock().unwrap().restart();
            format!("Redis down for {down_ms} ms")
        }
        Fault::PauseQueue { for_ms } => pause_queue(rig, for_ms),
        Fault::FillDisk { for_ms } => fill_disk(rig, for_ms),
        Fault::KillProxy => {
            let control = rig.state().join("egress/control.sock");
            match egress::control::Client::new(control)
                .ping()
                .ok()
                .and_then(|r| r.pid)
            {
                Some(pid) => {
                    signal(pid, "KILL");
                    format!("proxy {pid} killed")
                }
                None => "no proxy answered".into(),
            }
        }
    }
}

/// SIGKILL of worker `n` `after_ms` into the next job it starts (or at once, if it starts none
/// within 10 s), and the worker started again a second later.
fn kill_worker(rig: &Rig, n: usize, after_ms: u64) -> String {
    let log = rig.logs()[n].clone();
    let before = log.count("job_started");
    let until = Instant::now() + Duration::from_secs(10);
    while log.count("job_started") == before && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let met = log.count("job_started") > before;
    std::thread::sleep(Duration::from_millis(after_ms));
    let child = rig.workers.lock().unwrap()[n].0.take();
    let Some(mut child) = child else {
        return "no worker".into();
    };
    let _ = child.kill();
    let _ = child.wait();
    std::thread::sleep(Duration::from_secs(1));
    rig.start_worker(n);
    if met {
        format!("worker {n} killed {after_ms} ms into a job, started again")
    } else {
        format!("worker {n} killed idle, started again")
    }
}

fn pause_queue(rig: &Rig, for_ms: u64) -> String {
    match &rig.redis {
        Some(redis) => {
            let Some(pid) = redis.lock().unwrap().pid() else {
                return "Redis not running".into();
            };
            signal(pid, "STOP");
            std::thread::sleep(Duration::from_millis(for_ms));
            signal(pid, "CONT");
            format!("Redis stopped (SIGSTOP) for {for_ms} ms")
        }
        None => {
            let db = rusqlite::Connection::open(rig.state().join("queue.sqlite3")).unwrap();
            db.busy_timeout(Duration::from_secs(30)).unwrap();
            db.execute_batch("BEGIN EXCLUSIVE").unwrap();
            std::thread::sleep(Duration::from_millis(for_ms));
            db.execute_batch("ROLLBACK").unwrap();
            format!("the queue file locked for {for_ms} ms")
        }
    }
}

/// Fills the state's file system until less than `PI_DISK_MIN_MB` is free, for `for_ms`.
fn fill_disk(rig: &Rig, for_ms: u64) -> String {
    let state = rig.state();
    let free = config::files::free_bytes(&state).unwrap();
    let leave = (DISK_MIN_MB - 64) << 20;
    let fill = free.saturating_sub(leave);
    let path = state.join(".soak-filler");
    {
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x5au8; 1 << 20];
        let mut left = fill;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            file.write_all(&chunk[..n]).unwrap();
            left -= n as u64;
        }
    }
    let low = config::files::free_bytes(&state).unwrap() >> 20;
    std::thread::sleep(Duration::from_millis(for_ms));
    std::fs::remove_file(&path).unwrap();
    format!("{} MiB free for {for_ms} ms", low)
}

pub fn signal(pid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status();
}

/// The child's exit status, if it exits within `limit` (killed otherwise).
pub fn wait_bounded(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}
