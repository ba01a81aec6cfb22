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
