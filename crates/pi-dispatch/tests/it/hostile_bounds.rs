//! A hijacked job against the host's resources, in real jobs through the worker: pi's bash tool
//! forks without end, allocates without end, fills its `/tmp` and its workspace, and spins on the
//! CPU. The kernel keeps each bound (the job's control groups, its disk), the worker ends the job
//! with the bound's own reason and names the limit in the record, and it then takes the next job,
//! which completes.

use serde_json::json;
use testkit::fake_model::Step;

use crate::worker::{Service, queued_id, stdio};

/// Runs `attack` as a job under `env`'s bounds, then a plain job; returns the first job's record
/// once both are done, and insists the second completed.
fn attacked(attack: &str, env: &str) -> serde_json::Value {
    attacked_in(attack, env).0
}

/// [`attacked`], with the service (its repository, its deployment) kept for a look after.
fn attacked_in(attack: &str, env: &str) -> (serde_json::Value, Service) {
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
    (s.record(&first), s)
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

/// Every file under `dir` named `name`.
fn found(dir: &std::path::Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_name() == name {
            out.push(path.clone());
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(found(&path, name));
        }
    }
    out
}

#[test]
fn filling_the_workspace_ends_its_job_at_the_disk_limit_and_keeps_none_of_it() {
    let (record, s) = attacked_in(
        "head -c 2000M /dev/zero > /workspace/fill; ls -l /workspace/fill",
        "PI_JOB_DISK_MB=64\n",
    );
    ended_for(&record, "job-disk-limit", "PI_JOB_DISK_MB");
    let why = record["detail"]["why"].as_str().unwrap();
    assert!(why.contains("64 MiB"), "{why}");
    // Nothing of it stayed on the host: not in the repository, no disk image with the job's.
    assert!(!s.repo.join("fill").exists());
    assert_eq!(
        found(&s.d.path().join("state/jobs"), "disk.img"),
        Vec::<std::path::PathBuf>::new()
    );
}

#[test]
fn what_a_job_writes_within_its_disk_is_kept_in_its_workspace() {
    // The control: the same path, a write that fits, a file removed; both reach the repository.
    let (record, s) = attacked_in(
        "head -c 8M /dev/zero > /workspace/kept.bin && rm /workspace/README.md && echo wrote",
        "PI_JOB_DISK_MB=64\n",
    );
    assert_eq!(record["outcome"], "completed", "{record:#}");
    let kept = std::fs::metadata(s.repo.join("kept.bin")).unwrap();
    assert_eq!(kept.len(), 8 << 20);
    use std::os::unix::fs::MetadataExt as _;
    let owner = std::fs::metadata(&s.repo).unwrap();
    assert_eq!((kept.uid(), kept.gid()), (owner.uid(), owner.gid()));
    assert!(!s.repo.join("README.md").exists());
    let results: Vec<String> = s.model.requests().iter().map(|r| r.last_text()).collect();
    assert!(results.iter().any(|t| t.contains("wrote")), "{results:?}");
}

#[test]
fn what_a_job_leaves_is_copied_back_as_data() {
    // A link out of the repository, a FIFO, a file and a folder closed to everyone, and a sparse
    // file of a terabyte: the worker copies them back without following, opening or filling.
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(secret.path().join("root-only"), "cnry-host-file").unwrap();
    let attack = format!(
        "ln -s {}/root-only /workspace/link && mkfifo /workspace/fifo && \
         mkdir /workspace/closed && echo inside > /workspace/closed/f && chmod 000 /workspace/closed/f /workspace/closed && \
         truncate -s 1T /workspace/huge && echo planted",
        secret.path().display()
    );
    let started = std::time::Instant::now();
    let (record, s) = attacked_in(&attack, "PI_JOB_DISK_MB=64\n");
    assert_eq!(record["outcome"], "completed", "{record:#}");
    let results: Vec<String> = s.model.requests().iter().map(|r| r.last_text()).collect();
    assert!(results.iter().any(|t| t.contains("planted")), "{results:?}");
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    // The link is a link, as the job made it; what it names is untouched.
    let link = std::fs::symlink_metadata(s.repo.join("link")).unwrap();
    assert!(link.file_type().is_symlink());
    assert_eq!(
        std::fs::read_to_string(secret.path().join("root-only")).unwrap(),
        "cnry-host-file"
    );
    // No FIFO came back; the closed folder and file did, closed, the owner's.
    assert!(std::fs::symlink_metadata(s.repo.join("fifo")).is_err());
    let closed = std::fs::metadata(s.repo.join("closed")).unwrap();
    assert_eq!(closed.permissions().mode() & 0o777, 0o000);
    let owner = std::fs::metadata(&s.repo).unwrap();
    assert_eq!((closed.uid(), closed.gid()), (owner.uid(), owner.gid()));
    // The terabyte is a hole: its size, and next to no blocks.
    let huge = std::fs::metadata(s.repo.join("huge")).unwrap();
    assert_eq!(huge.len(), 1 << 40);
    assert!(huge.blocks() * 512 < 1 << 20, "{} blocks", huge.blocks());
    assert!(started.elapsed() < std::time::Duration::from_secs(120));
}

#[test]
fn a_hard_link_farm_comes_back_as_links_and_no_entry_comes_back_open_to_all() {
    // One 40 MiB file under 21 names, on a disk of 64 MiB; a file and a folder open to everyone,
    // and one setuid.
    let (record, s) = attacked_in(
        "head -c 40M /dev/urandom > /workspace/big && mkdir /workspace/farm && \
         for i in $(seq 20); do ln /workspace/big /workspace/farm/l$i; done && \
         mkdir /workspace/pub && echo x > /workspace/pub/f && chmod 666 /workspace/pub/f && \
         chmod 777 /workspace/pub && cp /workspace/pub/f /workspace/s && chmod 4755 /workspace/s && \
         ls /workspace/farm | wc -l",
        "PI_JOB_DISK_MB=64\n",
    );
    assert_eq!(record["outcome"], "completed", "{record:#}");
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    // The probe ran: the twenty names are there, each the one file.
    let big = std::fs::metadata(s.repo.join("big")).unwrap();
    assert_eq!(big.len(), 40 << 20);
    assert_eq!(big.nlink(), 21, "one file under 21 names, not 21 copies");
    for i in 1..=20 {
        let link = std::fs::metadata(s.repo.join(format!("farm/l{i}"))).unwrap();
        assert_eq!(link.ino(), big.ino());
    }
    // What the repository gained is the one file's data.
    let repo_blocks: u64 = walk_blocks(&s.repo);
    assert!(
        repo_blocks * 512 < 48 << 20,
        "{} MiB",
        (repo_blocks * 512) >> 20
    );
    let mode = |p: &str| {
        std::fs::symlink_metadata(s.repo.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("pub"), 0o775);
    assert_eq!(mode("pub/f"), 0o664);
    assert_eq!(mode("s"), 0o755);
}

/// The blocks of every file under `dir`, each file (inode) once.
fn walk_blocks(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else if seen.insert(meta.ino()) {
                total += meta.blocks();
            }
        }
    }
    total
}

#[test]
fn more_names_than_the_write_back_carries_end_the_job_and_none_comes_back() {
    // 200,004 names: four files linked 50,000 times each, a few MiB of folder blocks.
    let attack = "node -e 'const fs = require(\"fs\"); fs.mkdirSync(\"/workspace/names\"); \
        for (let f = 0; f < 4; f++) { const p = `/workspace/names/f${f}`; fs.writeFileSync(p, \"x\"); \
        for (let i = 0; i < 50000; i++) fs.linkSync(p, `${p}-${i}`); } \
        console.log(fs.readdirSync(\"/workspace/names\").length)'";
    let (record, s) = attacked_in(attack, "PI_JOB_DISK_MB=64\n");
    assert_eq!(record["reason"], "job-write-back-too-large", "{record:#}");
    assert_eq!(record["outcome"], "policy", "{record:#}");
    let why = record["detail"]["why"].as_str().unwrap();
    assert!(why.contains("entries") && why.contains("200000"), "{why}");
    assert!(why.contains("nothing was copied"), "{why}");
    // The probe ran (the names were made in the job), and none reached the repository.
    let results: Vec<String> = s.model.requests().iter().map(|r| r.last_text()).collect();
    assert!(results.iter().any(|t| t.contains("200004")), "{results:?}");
    assert!(!s.repo.join("names").exists());
}
