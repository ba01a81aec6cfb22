//! A job's own identity on the host: a uid and gid from a pool the worker owns, used by nothing
//! else on the host while the job runs, so that no other process but root's can read, trace or
//! signal the job's processes (the kernel lets a process do that to another only as the same user,
//! or as the owner of its user namespace, which is that same uid here).
//!
//! The job still writes its repository as the repository's owner: the worker attaches an
//! *idmapped* mount of the repository (`mount_setattr` with `MOUNT_ATTR_IDMAP`), in which the
//! owner's files appear as the job's and what the job writes is stored as the owner's. The job
//! binds that mount as its workspace.
//!
//! Taking an id is an `flock` on a file of its own in [`LOCK_DIR`], held while the job runs, so
//! the workers of every deployment on the host share one pool; and a check that no process on the
//! host runs with the id, so that an id the operator handed out by mistake is skipped (and said).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where the pool's locks are: one file an id, on the host, for the workers of every deployment.
pub const LOCK_DIR: &str = "/run/pi-dispatch/job-ids";

/// The ids a worker's jobs run as.
#[derive(Debug, Default)]
pub struct Pool {
    pub first: u32,
    pub last: u32,
    pub lock_dir: PathBuf,
    /// When each id was last found in use by no process of the host: a look through `/proc`
    /// takes about 2 ms, so an id is looked for again at most every [`RECHECK`].
    pub checked: Mutex<HashMap<u32, std::time::Instant>>,
}

/// How long an id found unused by any process of the host is taken as unused.
pub const RECHECK: std::time::Duration = std::time::Duration::from_secs(60);

impl Pool {
    /// The pool `first..=last`, its locks in `lock_dir`.
    pub fn new(first: u32, last: u32, lock_dir: impl Into<PathBuf>) -> Pool {
        Pool {
            first,
            last,
            lock_dir: lock_dir.into(),
            checked: Mutex::default(),
        }
    }
}

/// An id taken for one job: free again when dropped.
#[derive(Debug)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    _lock: File,
}

/// Whether a `/proc/PID/status` names `id` as one of its uids or gids (real, effective, saved,
/// file system). Pure.
pub fn status_uses(status: &str, id: u32) -> bool {
    status.lines().any(|l| {
        (l.starts_with("Uid:") || l.starts_with("Gid:"))
            && l[4..]
                .split_whitespace()
                .any(|v| v.parse::<u32>() == Ok(id))
    })
}

/// Whether any process on the host runs with `id` as a uid or gid.
pub fn in_use(id: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.filter_map(Result::ok).any(|e| {
        e.file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            && std::fs::read_to_string(e.path().join("status")).is_ok_and(|s| status_uses(&s, id))
    })
}

/// An exclusive `flock` on the file at `path` (made, mode 0600, when missing), if no other open
/// file holds it: `None` while one does. It holds across processes and goes with its holder.
pub fn try_lock(path: &Path) -> std::io::Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(file)),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(None),
        Err(e) => Err(e.into()),
    }
}

impl Pool {
    /// A free id of the pool, or `None` when every one is taken; and the ids skipped because a
    /// process of the host runs with them (the operator's pool overlaps a user).
    pub fn take(&self) -> std::io::Result<(Option<Identity>, Vec<u32>)> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.lock_dir)?;
        let mut skipped = Vec::new();
        for id in self.first..=self.last {
            let Some(file) = try_lock(&self.lock_dir.join(format!("{id}.lock")))? else {
                continue;
            };
            let fresh = {
                let checked = self
                    .checked
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                checked.get(&id).is_some_and(|at| at.elapsed() < RECHECK)
            };
            if !fresh {
                if in_use(id) {
                    skipped.push(id);
                    continue;
                }
                self.checked
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(id, std::time::Instant::now());
            }
            let identity = Identity {
                uid: id,
                gid: id,
                _lock: file,
            };
            return Ok((Some(identity), skipped));
        }
        Ok((None, skipped))
    }
}

/// A user namespace mapping `owner` (uid, gid: on disk) to `job` (in the job), for an idmapped
/// mount. Made by a short-lived `unshare --user` whose maps root writes; its descriptor is all
/// that is kept.
pub fn mapping(owner: (u32, u32), job: (u32, u32)) -> std::io::Result<OwnedFd> {
    let own = std::fs::metadata("/proc/self/ns/user")?;
    let mut child = std::process::Command::new("/usr/bin/unshare")
        .args(["--user", "--", "/bin/cat"])
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let pid = child.id();
    let ns = PathBuf::from(format!("/proc/{pid}/ns/user"));
    let made = (|| {
        use std::os::unix::fs::MetadataExt as _;
        for _ in 0..2000 {
            match std::fs::metadata(&ns) {
                Ok(m) if m.ino() != own.ino() => {
                    std::fs::write(
                        format!("/proc/{pid}/uid_map"),
                        format!("{} {} 1\n", owner.0, job.0),
                    )?;
                    std::fs::write(
                        format!("/proc/{pid}/gid_map"),
                        format!("{} {} 1\n", owner.1, job.1),
                    )?;
                    return Ok(File::open(&ns)?.into());
                }
                Ok(_) => std::thread::sleep(std::time::Duration::from_micros(200)),
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the user namespace was not made",
        ))
    })();
    drop(child.stdin.take());
    let _ = child.kill();
    let _ = child.wait();
    made
}

/// What a root worker gives each job its own identity with: the pool, and the mappings made.
#[derive(Debug)]
pub struct Identities {
    pub pool: Pool,
    pub mappings: Mappings,
}

/// User namespaces for idmapped mounts, kept by their mapping: a worker's jobs use few.
#[derive(Debug, Default)]
pub struct Mappings(Mutex<HashMap<(Ids, Ids), Arc<OwnedFd>>>);

/// A uid and a gid.
type Ids = (u32, u32);

impl Mappings {
    pub fn get(&self, owner: (u32, u32), job: (u32, u32)) -> std::io::Result<Arc<OwnedFd>> {
        let mut all = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(fd) = all.get(&(owner, job)) {
            return Ok(fd.clone());
        }
        let fd = Arc::new(mapping(owner, job)?);
        all.insert((owner, job), fd.clone());
        Ok(fd)
    }
}

/// The job's view of a folder, attached at a place of the worker's: unmounted when dropped.
#[derive(Debug)]
pub struct IdmappedFolder {
    at: PathBuf,
}

impl IdmappedFolder {
    /// Attaches `folder` at `at` (an empty folder it makes, mode 0700), with the mapping of
    /// `userns`, `nosuid` and `nodev`. A mount left at `at` by an earlier attempt goes first.
    pub fn attach(folder: &Path, userns: &OwnedFd, at: &Path) -> std::io::Result<IdmappedFolder> {
        use rustix::mount::{MoveMountFlags, OpenTreeFlags};
        use std::os::unix::fs::DirBuilderExt as _;
        let _ = rustix::mount::unmount(at, rustix::mount::UnmountFlags::DETACH);
        match std::fs::DirBuilder::new().mode(0o700).create(at) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let source = crate::bwrap::open_folder(folder)?;
        let tree = rustix::mount::open_tree(
            &source,
            "",
            OpenTreeFlags::OPEN_TREE_CLONE
                | OpenTreeFlags::OPEN_TREE_CLOEXEC
                | OpenTreeFlags::AT_EMPTY_PATH,
        )?;
        sys::idmap(tree.as_fd(), userns.as_fd())?;
        rustix::mount::move_mount(
            &tree,
            "",
            rustix::fs::CWD,
            at,
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )?;
        Ok(IdmappedFolder { at: at.to_owned() })
    }

    /// Where the job's view is.
    pub fn path(&self) -> &Path {
        &self.at
    }
}

impl Drop for IdmappedFolder {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.at, rustix::mount::UnmountFlags::DETACH);
        let _ = std::fs::remove_dir(&self.at);
    }
}

/// Unmounts what a worker killed outright left attached under `dir` (its jobs' folders): every
/// mount point below it in `/proc/self/mountinfo`.
pub fn sweep(dir: &Path) {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    for line in text.lines() {
        let Some(point) = line.split(' ').nth(4) else {
            continue;
        };
        let point = Path::new(point);
        if point.starts_with(dir) && point != dir {
            let _ = rustix::mount::unmount(point, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// The lock a worker holds on a job's folder (`state/jobs/ID`) for as long as it works in it: one
/// file an attempt, so a worker that took a job over (its first worker was away past the lease)
/// never waits for the one it took it from. The folder is made if missing. A lock held by another
/// open file is an error (`WouldBlock`).
pub fn lock_job_folder(folder: &Path, attempt: u32) -> std::io::Result<File> {
    std::fs::create_dir_all(folder)?;
    let path = folder.join(format!(".worker-{attempt}.lock"));
    // A sweep looking at the lock holds it for a moment: a few tries ride that out.
    for _ in 0..50 {
        if let Some(lock) = try_lock(&path)? {
            return Ok(lock);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(std::io::ErrorKind::WouldBlock.into())
}

/// Whether a live worker holds a lock of the job folder `folder` (see [`lock_job_folder`]).
pub fn job_folder_held(folder: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return false;
    };
    entries.filter_map(Result::ok).any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.starts_with(".worker-")
            && name.ends_with(".lock")
            && !matches!(try_lock(&e.path()), Ok(Some(_)))
    })
}

/// Unmounts what workers that are gone left mounted in the job folders under `jobs` (their
/// views, disks and `/job`): every mount point below a folder no live worker holds. A job of a
/// live worker of the same deployment keeps its mounts.
pub fn sweep_jobs(jobs: &Path) {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut folders: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter_map(|point| {
            let rest = Path::new(point).strip_prefix(jobs).ok()?;
            let first = rest.components().next()?;
            Some(jobs.join(first))
        })
        .collect();
    folders.sort();
    folders.dedup();
    for folder in folders {
        sweep_job(&folder);
    }
}

/// Unmounts what is mounted in the job folder `folder` unless a live worker holds it.
pub fn sweep_job(folder: &Path) {
    if !job_folder_held(folder) {
        sweep(folder);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_names_the_ids_a_process_runs_with() {
        let status = "Name:\tsleep\nUid:\t0\t1879048193\t0\t0\nGid:\t0\t0\t0\t0\n";
        assert!(status_uses(status, 1_879_048_193));
        assert!(status_uses(status, 0));
        assert!(!status_uses(status, 1_879_048_192));
        assert!(!status_uses("Name:\tx\nPid:\t7\n", 7));
    }
}
