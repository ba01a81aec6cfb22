#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A job's disk, made for real: a loop-mounted file system of its own under an overlay on the
//! workspace. Needs root (mount, loop devices), as the worker that makes it does.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use sandbox::disk::JobDisk;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

const OWNER: (u32, u32) = (4321, 4321);

fn workspace() -> tempfile::TempDir {
    let ws = tempfile::tempdir().unwrap();
    let w = ws.path();
    std::fs::create_dir_all(w.join("src")).unwrap();
    std::fs::write(w.join("src/lib.rs"), "old").unwrap();
    std::fs::write(w.join("gone.txt"), "to be removed").unwrap();
    std::fs::create_dir_all(w.join("build/cache")).unwrap();
    std::fs::write(w.join("build/cache/a"), "stale").unwrap();
    std::fs::write(w.join("build/keep-not"), "stale").unwrap();
    for p in [
        "",
        "src",
        "src/lib.rs",
        "gone.txt",
        "build",
        "build/cache",
        "build/cache/a",
    ] {
        std::os::unix::fs::chown(w.join(p), Some(OWNER.0), Some(OWNER.1)).unwrap();
    }
    ws
}

/// A workspace, a job's folder, and a disk of `limit` bytes over the workspace made in it; `None`
/// (the test skipped) when not root.
fn made(limit: u64) -> Option<(tempfile::TempDir, tempfile::TempDir, JobDisk)> {
    if !is_root() {
        eprintln!("skipped: a job's disk is made by a root worker");
        return None;
    }
    let ws = workspace();
    let job = tempfile::tempdir().unwrap();
    let disk = JobDisk::make(job.path(), ws.path(), limit, OWNER).unwrap();
    Some((ws, job, disk))
}

#[test]
fn what_the_job_writes_goes_to_its_disk_and_back_into_the_workspace_after() {
    let Some((ws, job, disk)) = made(64 << 20) else {
        return;
    };
    let m = disk.path();
    // The job changes a file, removes one, replaces a folder with a new one, adds a link.
    std::fs::write(m.join("src/lib.rs"), "new").unwrap();
    std::fs::write(m.join("src/added.rs"), "added").unwrap();
    std::fs::remove_file(m.join("gone.txt")).unwrap();
    std::fs::remove_dir_all(m.join("build")).unwrap();
    std::fs::create_dir(m.join("build")).unwrap();
    std::fs::write(m.join("build/fresh"), "fresh").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", m.join("link")).unwrap();
    // Nothing reached the workspace while the job ran.
    assert_eq!(
        std::fs::read_to_string(ws.path().join("src/lib.rs")).unwrap(),
        "old"
    );
    assert!(ws.path().join("gone.txt").exists());
    let written = disk.written().unwrap();
    assert!(!written.full);
    let done = disk.write_back().unwrap();
    // The copy's thread took another id: the kernel made the process undumpable, so no process
    // of that id can trace it or read its memory.
    assert!(
        !matches!(
            rustix::process::dumpable_behavior().unwrap(),
            rustix::process::DumpableBehavior::Dumpable
        ),
        "the worker stayed dumpable after a thread took the job's id"
    );
    drop(disk);
    let w = ws.path();
    assert_eq!(
        std::fs::read_to_string(w.join("src/lib.rs")).unwrap(),
        "new"
    );
    assert_eq!(
        std::fs::read_to_string(w.join("src/added.rs")).unwrap(),
        "added"
    );
    assert!(!w.join("gone.txt").exists());
    assert!(
        !w.join("build/cache").exists(),
        "the job's new folder replaced the old one"
    );
    assert!(!w.join("build/keep-not").exists());
    assert_eq!(
        std::fs::read_to_string(w.join("build/fresh")).unwrap(),
        "fresh"
    );
    assert_eq!(
        std::fs::read_link(w.join("link")).unwrap(),
        Path::new("/etc/passwd")
    );
    for p in ["src/lib.rs", "src/added.rs", "build", "build/fresh"] {
        let meta = std::fs::metadata(w.join(p)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), OWNER, "{p}");
    }
    assert_eq!(done.removed, 2, "{done:?}");
    // The disk is gone with its image and mount points.
    assert_eq!(std::fs::read_dir(job.path()).unwrap().count(), 0);
}

#[test]
fn a_job_cannot_write_past_its_disk() {
    let Some((_ws, _job, disk)) = made(16 << 20) else {
        return;
    };
    let big = vec![7u8; 1 << 20];
    let mut file = std::fs::File::create(disk.path().join("fill")).unwrap();
    let mut wrote = 0u64;
    let refused = loop {
        use std::io::Write as _;
        match file.write_all(&big).and_then(|()| file.sync_data()) {
            Ok(()) => wrote += 1 << 20,
            Err(e) => break e,
        }
        assert!(
            wrote <= 32 << 20,
            "the kernel let the job write past its disk"
        );
    };
    assert_eq!(refused.raw_os_error(), Some(libc_enospc()));
    drop(file);
    let written = disk.written().unwrap();
    assert!(written.full, "{written:?}");
    assert!(written.bytes > 8 << 20, "{written:?}");
}

fn libc_enospc() -> i32 {
    rustix::io::Errno::NOSPC.raw_os_error()
}

#[test]
fn a_disk_used_again_holds_nothing_of_the_job_before() {
    let Some((ws, job, disk)) = made(32 << 20) else {
        return;
    };
    // The first job leaves a secret, a folder it closed to everyone, and a file that fills a
    // quarter of the disk.
    let m = disk.path().to_owned();
    std::fs::write(m.join("secret"), "cnry-previous-job").unwrap();
    std::fs::create_dir_all(m.join("closed/inner")).unwrap();
    std::fs::write(m.join("closed/inner/f"), "x").unwrap();
    std::fs::set_permissions(
        m.join("closed"),
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .unwrap();
    std::fs::write(m.join("big"), vec![1u8; 8 << 20]).unwrap();
    let fs = disk.recycle().expect("the disk is emptied");
    // The next job, over another workspace, sees its own workspace only and the whole disk.
    let next_ws = workspace();
    let next = JobDisk::over(fs, job.path(), next_ws.path(), OWNER).unwrap();
    let mut seen: Vec<String> = std::fs::read_dir(next.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    seen.sort();
    assert_eq!(seen, ["build", "gone.txt", "src"]);
    let written = next.written().unwrap();
    assert!(written.bytes < 1 << 20, "{written:?}");
    assert!(!written.full);
    drop(next);
    drop(ws);
}

/// Mount points under `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(dir))
        .map(str::to_owned)
        .collect()
}

#[test]
fn workers_sharing_a_state_keep_their_disks_apart_and_clear_only_the_deads() {
    use sandbox::disk::Spares;
    if !is_root() {
        eprintln!("skipped: a job's disk is made by a root worker");
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let root = state.path().join("disks");
    // A live worker with a disk made ahead, and one in use by a job.
    let first = Spares::new(&root, 16 << 20);
    first.prepare(7).unwrap();
    let in_use = first.take(8).unwrap();
    let job = tempfile::tempdir().unwrap();
    let ws = workspace();
    let running = JobDisk::over(in_use, job.path(), ws.path(), OWNER).unwrap();
    std::fs::write(running.path().join("written"), "by the running job").unwrap();
    // What workers killed outright left: a folder with its lock free (a tmpfs mounted in it, as
    // a disk left mounted would be), and one of an older version with no lock at all.
    for dead in ["w1-1", "3-0"] {
        let folder = root.join(dead).join("disk");
        std::fs::create_dir_all(&folder).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(&folder)
            .status()
            .unwrap();
        assert!(mounted.success());
    }
    std::fs::write(root.join("w1-1.lock"), "").unwrap();
    let before = mounts_under(&root);
    assert_eq!(before.len(), 4, "{before:?}");

    // A second worker starts: the dead ones' folders go, the live one's disks stay mounted.
    let second = Spares::new(&root, 16 << 20);
    for dead in ["w1-1", "3-0", "w1-1.lock"] {
        assert!(!root.join(dead).exists(), "{dead} was left");
    }
    let after = mounts_under(&root);
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(after.iter().all(|m| before.contains(m)), "{after:?}");
    assert_eq!(
        std::fs::read_to_string(running.path().join("written")).unwrap(),
        "by the running job"
    );
    let spare = first.take(7).unwrap();
    let next = JobDisk::over(spare, tempfile::tempdir().unwrap().path(), ws.path(), OWNER);
    assert!(next.is_ok(), "the first worker's spare was spoiled");
    drop(next);

    // Each worker closing removes its own folder and lock, and nothing of the other's.
    second.prepare(9).unwrap();
    drop(running);
    first.close();
    assert_eq!(mounts_under(&root).len(), 1, "{:?}", mounts_under(&root));
    second.close();
    assert_eq!(mounts_under(&root), Vec::<String>::new());
    let left: Vec<_> = std::fs::read_dir(&root).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_worker_starting_unmounts_only_the_job_folders_no_live_worker_holds() {
    use sandbox::identity::{lock_job_folder, sweep_jobs};
    if !is_root() {
        eprintln!("skipped: mounting takes root");
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let jobs = state.path().join("jobs");
    // A running job of a live worker (its folder's lock held), and one whose worker was killed
    // (its lock free), each with something mounted in it.
    let live = jobs.join("cli-1-live");
    let dead = jobs.join("cli-2-dead");
    let held = lock_job_folder(&live, 1).unwrap();
    drop(lock_job_folder(&dead, 1).unwrap());
    for folder in [&live, &dead] {
        std::fs::create_dir_all(folder.join("view")).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(folder.join("view"))
            .status()
            .unwrap();
        assert!(mounted.success());
    }
    // A second attempt of the live job, by the worker that took it over, takes a lock of its own.
    let takeover = lock_job_folder(&live, 2).unwrap();
    assert_eq!(mounts_under(&jobs).len(), 2);
    sweep_jobs(&jobs);
    assert_eq!(
        mounts_under(&jobs),
        vec![live.join("view").display().to_string()]
    );
    // Once its workers are gone, the next sweep takes it too.
    drop(held);
    sweep_jobs(&jobs);
    assert_eq!(
        mounts_under(&jobs).len(),
        1,
        "the takeover's lock is still held"
    );
    drop(takeover);
    sweep_jobs(&jobs);
    assert_eq!(mounts_under(&jobs), Vec::<String>::new());
}

#[test]
fn blocks_an_earlier_job_freed_late_are_not_taken_off_what_the_next_job_wrote() {
    let Some((ws, job, disk)) = made(32 << 20) else {
        return;
    };
    // The earlier job's big file is still open (a process of it not yet gone) when its disk is
    // emptied: its blocks are freed only once that process lets go, during the next job.
    std::fs::write(disk.path().join("big"), vec![1u8; 4 << 20]).unwrap();
    let lingering = std::fs::File::open(disk.path().join("big")).unwrap();
    let fs = disk.recycle().expect("the disk is emptied");
    let next = JobDisk::over(fs, job.path(), ws.path(), OWNER).unwrap();
    std::fs::write(next.path().join("small"), "written by the next job").unwrap();
    drop(lingering);
    let written = next.written().unwrap();
    assert!(written.bytes >= 4096, "{written:?}");
    next.write_back().expect("the next job's write comes back");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("small")).unwrap(),
        "written by the next job"
    );
}
