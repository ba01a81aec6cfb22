#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The jobs' control groups, made for real under the test's own (root, with the `pids` and
//! `memory` controllers, as a root worker has them).

use sandbox::cgroup::{Hierarchy, JobCgroup, Limits, group_name, remove_idle};

fn hierarchy() -> Option<Hierarchy> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: a job's groups are made by a root worker");
        return None;
    }
    let found = sandbox::cgroup::detect();
    if found.is_none() {
        eprintln!("skipped: no pids and memory controllers here");
    }
    found
}

fn exists(h: &Hierarchy, uid: u32) -> bool {
    let name = group_name(uid);
    match h {
        Hierarchy::V1 { pids, memory, .. } => {
            pids.join(&name).exists() || memory.join(&name).exists()
        }
        Hierarchy::V2 { parent } => parent.join(&name).exists(),
    }
}

#[test]
fn a_stopping_worker_removes_the_groups_of_ids_no_job_holds() {
    let Some(h) = hierarchy() else {
        return;
    };
    let locks = tempfile::tempdir().unwrap();
    let limits = Limits {
        pids: 64,
        memory_bytes: 64 << 20,
        cpu_secs: 60,
    };
    let (busy, idle) = (1_879_051_000, 1_879_051_001);
    // One id's job still runs (its lock held, as the pool holds it); the other's job is over.
    let held = sandbox::identity::try_lock(&locks.path().join(format!("{busy}.lock")))
        .unwrap()
        .unwrap();
    let running = JobCgroup::take(&h, busy, &limits).unwrap();
    drop(JobCgroup::take(&h, idle, &limits).unwrap());
    assert!(exists(&h, busy) && exists(&h, idle));
    remove_idle(&h, busy..=idle, locks.path());
    assert!(!exists(&h, idle), "the idle id's groups were left");
    assert!(exists(&h, busy), "a running job's groups were removed");
    // Once that job is over, they go too.
    drop(running);
    drop(held);
    remove_idle(&h, busy..=idle, locks.path());
    assert!(!exists(&h, busy));
}
