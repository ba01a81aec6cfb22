//! A job's disk: what a job writes to its workspace is held on a file system of its own, of a
//! fixed size, so the kernel refuses a byte past it. The job sees its workspace through an
//! overlay: the workspace (or the job's view of it) below, read-only, and the job's file system
//! above. After the job, what it wrote is copied back into the workspace as data: regular files,
//! folders and links only, each opened beneath the folder it belongs to, never a link followed.
//!
//! The copy writes no more than the job's disk held: it is measured first, and refused whole when
//! its data is more than the disk's use or its names more than [`MAX_ENTRIES`]; a file the job
//! linked under several names comes back as one file under those names (hard links), never a
//! copy each; a sparse file comes back sparse. No entry comes back writable by others, setuid or
//! setgid.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// `mkfs.ext4`, where Debian and most hosts keep it.
pub const MKFS: [&str; 2] = ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"];
/// `mount`, for the loop device the job's file system lives on.
pub const MOUNT: [&str; 2] = ["/usr/bin/mount", "/bin/mount"];

/// With less room than this share of it (and at least [`FULL_BYTES`]), or a few inodes, the job's
/// file system is full: ext4 refuses writes while it still counts some room as free.
const FULL_SHARE: u64 = 50;
const FULL_BYTES: u64 = 2 << 20;
const FULL_INODES: u64 = 16;
/// Folders deeper than this in what a job wrote are not copied back.
pub const MAX_DEPTH: usize = 256;
/// The most names (files, links, folders, removals) a job's writes may bring back.
pub const MAX_ENTRIES: u64 = 200_000;
/// The most files linked under several names whose first copy the write-back keeps open to link
/// the others to; past it, a further name is copied (and counted against the bound).
const MAX_LINKED: usize = 4096;
/// The permissions an entry keeps: never writable by others, never setuid, setgid or sticky.
const KEPT_MODE: u32 = 0o775;

/// The first of `candidates` that is there.
pub fn program(candidates: &[&str]) -> Option<PathBuf> {
    candidates.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// Whether this host can give a job a disk of its own: root, the programs, and a loop device.
pub fn available() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("the worker is not root".to_owned());
    }
    if program(&MKFS).is_none() {
        return Err("mkfs.ext4 is missing (Debian's e2fsprogs)".to_owned());
    }
    if program(&MOUNT).is_none() {
        return Err("mount is missing (Debian's mount)".to_owned());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Err("the host has no loop devices (/dev/loop-control)".to_owned());
    }
    Ok(())
}

/// A job's file system, made ahead or for the job: its image (`disk.img`, sparse) in a folder
/// of its own, mounted there (`disk`) and reached through the descriptor of its root. Unmounted,
/// and the image removed, when dropped.
#[derive(Debug)]
pub struct Prepared {
    place: PathBuf,
    image: PathBuf,
    mount: PathBuf,
    root: Option<OwnedFd>,
    limit: u64,
    /// What the file system used when it was new and empty.
    pristine: u64,
    /// Whether `place` is the file system's own folder (a spare's), removed with it.
    owns_place: bool,
}

impl Prepared {
    /// Makes a file system of `limit` bytes in `place` and mounts it there. What an earlier
    /// attempt left in `place` goes first.
    pub fn make(place: &Path, limit: u64) -> io::Result<Prepared> {
        let mut fs = Prepared {
            place: place.to_owned(),
            image: place.join("disk.img"),
            mount: place.join("disk"),
            root: None,
            limit,
            pristine: 0,
            owns_place: false,
        };
        fs.release();
        let mkfs = program(&MKFS).ok_or_else(|| io::Error::other("mkfs.ext4 is missing"))?;
        let mount = program(&MOUNT).ok_or_else(|| io::Error::other("mount is missing"))?;
        match std::fs::DirBuilder::new().mode(0o700).create(place) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            let image = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&fs.image)?;
            image.set_len(limit)?;
        }
        // No journal (the disk lasts one job), no blocks kept for root, inode tables made lazily.
        let mut mkfs = helper(mkfs);
        mkfs.args(["-q", "-F", "-O", "^has_journal", "-m", "0", "-E"])
            .arg("lazy_itable_init=1,nodiscard")
            .arg(&fs.image);
        run(&mut mkfs, "mkfs.ext4")?;
        std::fs::DirBuilder::new().mode(0o700).create(&fs.mount)?;
        let mut mount = helper(mount);
        mount
            .args(["-t", "ext4", "-o", "loop,nosuid,nodev,noinit_itable"])
            .arg(&fs.image)
            .arg(&fs.mount);
        run(&mut mount, "mount")?;
        let root = open_dir(rustix::fs::CWD, fs.mount.as_os_str())?;
        fs.pristine = used(root.as_fd())?;
        fs.root = Some(root);
        Ok(fs)
    }

    /// The file system's root.
    fn root(&self) -> io::Result<BorrowedFd<'_>> {
        self.root
            .as_ref()
            .map(AsFd::as_fd)
            .ok_or_else(|| io::Error::other("the job's file system is gone"))
    }

    fn release(&mut self) {
        self.root = None;
        let _ = rustix::mount::unmount(&self.mount, rustix::mount::UnmountFlags::DETACH);
        let _ = std::fs::remove_dir(&self.mount);
        let _ = std::fs::remove_file(&self.image);
        if self.owns_place {
            let _ = std::fs::remove_dir(&self.place);
        }
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        self.release();
    }
}

/// A job's disk: its file system, and the overlay the job works in (`merged`, in the job's
/// folder). Everything is unmounted and the image removed when it is dropped.
#[derive(Debug)]
pub struct JobDisk {
    merged: PathBuf,
    lower: PathBuf,
    owner: (u32, u32),
    baseline: u64,
    /// Taken out when the file system is used again.
    fs: Option<Prepared>,
}

/// What a job's disk holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub bytes: u64,
    pub full: bool,
}

/// Why a job's writes were not copied back.
#[derive(Debug, thiserror::Error)]
pub enum WriteBackError {
    /// More than the write-back carries: nothing was written when `partial` is false; else the
    /// copy stopped there, with the entries written so far left in the workspace.
    #[error("the job's writes hold more {what} than the write-back carries ({bound})")]
    PastBound {
        what: &'static str,
        bound: u64,
        partial: bool,
    },
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl From<rustix::io::Errno> for WriteBackError {
    fn from(e: rustix::io::Errno) -> WriteBackError {
        WriteBackError::Io(e.into())
    }
}

/// What copying a job's writes back did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Files and links written, and their bytes.
    pub files: u64,
    pub bytes: u64,
    /// Names written as another name of a file already written (the job's hard links).
    pub linked: u64,
    /// Entries the job removed, removed.
    pub removed: u64,
    /// Entries not copied back: special files, or folders past [`MAX_DEPTH`].
    pub skipped: u64,
}

impl JobDisk {
    /// Makes a disk of `limit` bytes in `dir` over `lower`, the job's folder seen as `owner` (whose
    /// the top of the overlay is).
    pub fn make(dir: &Path, lower: &Path, limit: u64, owner: (u32, u32)) -> io::Result<JobDisk> {
        JobDisk::over(Prepared::make(dir, limit)?, dir, lower, owner)
    }

    /// Lays the overlay of a job in `dir` over `lower` with `fs` above it. A mount an earlier
    /// attempt left in `dir` goes first.
    pub fn over(fs: Prepared, dir: &Path, lower: &Path, owner: (u32, u32)) -> io::Result<JobDisk> {
        let merged = dir.join("merged");
        let _ = rustix::mount::unmount(&merged, rustix::mount::UnmountFlags::DETACH);
        match std::fs::DirBuilder::new().mode(0o700).create(&merged) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        let root = fs.root()?;
        let private = Mode::from_raw_mode(0o700);
        rustix::fs::mkdirat(root, "work", private)?;
        let top = rustix::fs::stat(lower)?;
        rustix::fs::mkdirat(root, "upper", private)?;
        rustix::fs::chownat(
            root,
            "upper",
            Some(rustix::fs::Uid::from_raw(owner.0)),
            Some(rustix::fs::Gid::from_raw(owner.1)),
            AtFlags::empty(),
        )?;
        rustix::fs::chmodat(
            root,
            "upper",
            Mode::from_raw_mode(top.st_mode & 0o7777),
            AtFlags::empty(),
        )?;
        // What the file system uses before the job, never more than it used new: blocks an
        // earlier job's files hold after their removal (a process of that job still had one open)
        // are freed later, and must not be taken off what this job writes.
        let baseline = used(root)?.min(fs.pristine);
        // The layers by descriptor, so no character of the deployment's path can reach the
        // overlay's options. The overlay keeps its marks in `user.` attributes (which the job's
        // own id may read back after; the overlay never lets the job set them), makes no
        // redirects and follows none, and copies a file whole when the job changes it.
        let lower_fd = open_dir(rustix::fs::CWD, lower.as_os_str())?;
        let upper_fd = open_dir(root, OsStr::new("upper"))?;
        let work_fd = open_dir(root, OsStr::new("work"))?;
        let by_fd = |fd: &OwnedFd| {
            use std::os::fd::AsRawFd as _;
            format!("/proc/self/fd/{}", fd.as_raw_fd())
        };
        let options = format!(
            "lowerdir={},upperdir={},workdir={},userxattr,redirect_dir=nofollow,metacopy=off,index=off,xino=off",
            by_fd(&lower_fd),
            by_fd(&upper_fd),
            by_fd(&work_fd)
        );
        rustix::mount::mount(
            "overlay",
            &merged,
            "overlay",
            rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
            Some(
                std::ffi::CString::new(options)
                    .map_err(io::Error::other)?
                    .as_c_str(),
            ),
        )?;
        Ok(JobDisk {
            merged,
            lower: lower.to_owned(),
            owner,
            baseline,
            fs: Some(fs),
        })
    }

    /// Where the job works: its workspace with what it wrote over it.
    pub fn path(&self) -> &Path {
        &self.merged
    }

    /// The disk's size.
    pub fn limit(&self) -> u64 {
        self.fs.as_ref().map_or(0, |fs| fs.limit)
    }

    fn fs(&self) -> io::Result<&Prepared> {
        self.fs
            .as_ref()
            .ok_or_else(|| io::Error::other("the job's file system is gone"))
    }

    /// Ends the overlay and empties the file system for the id's next job: making one anew costs
    /// more than emptying it, and unmounting one slows the next job's start (the kernel's next
    /// moves into control groups wait longer after it). `None` when it cannot be emptied.
    pub fn recycle(mut self) -> Option<Prepared> {
        let _ = rustix::mount::unmount(&self.merged, rustix::mount::UnmountFlags::DETACH);
        let fs = self.fs.take()?;
        let root = fs.root().ok()?;
        for name in ["upper", "work"] {
            remove(root, OsStr::new(name)).ok()?;
        }
        Some(fs)
    }

    /// What the job wrote so far, and whether its disk is full.
    pub fn written(&self) -> io::Result<Written> {
        let s = rustix::fs::fstatfs(self.fs()?.root()?)?;
        let block = u64::try_from(s.f_bsize).unwrap_or(0);
        let used = (s.f_blocks.saturating_sub(s.f_bfree)).saturating_mul(block);
        Ok(Written {
            bytes: used.saturating_sub(self.baseline),
            full: s.f_bavail.saturating_mul(block) < (self.limit() / FULL_SHARE).max(FULL_BYTES)
                || s.f_ffree < FULL_INODES,
        })
    }

    /// Ends the overlay and copies what the job wrote into the folder below it. The copy runs on
    /// a thread of its own that takes the job's ids (`owner`) for good first: it reads the job's
    /// files as the job and writes them through the job's view as the job would have, so it needs
    /// no capability, and whatever the job left cannot make it write where the job could not.
    pub fn write_back(&self) -> Result<Applied, WriteBackError> {
        // What the job's disk holds bounds what comes back.
        let bound = Bound {
            bytes: self.written()?.bytes,
            entries: MAX_ENTRIES,
        };
        let _ = rustix::mount::unmount(&self.merged, rustix::mount::UnmountFlags::DETACH);
        let upper = open_dir(self.fs()?.root()?, OsStr::new("upper"))?;
        let target = open_dir(rustix::fs::CWD, self.lower.as_os_str())?;
        let (uid, gid) = self.owner;
        let as_root = rustix::process::geteuid().is_root();
        std::thread::Builder::new()
            .name("write-back".into())
            .spawn(move || {
                if as_root && uid != 0 {
                    use rustix::fs::{Gid, Uid};
                    use rustix::thread as t;
                    t::set_thread_groups(&[])?;
                    t::set_thread_res_gid(
                        Gid::from_raw(gid),
                        Gid::from_raw(gid),
                        Gid::from_raw(gid),
                    )?;
                    t::set_thread_res_uid(
                        Uid::from_raw(uid),
                        Uid::from_raw(uid),
                        Uid::from_raw(uid),
                    )?;
                }
                measure(&upper, bound)?;
                apply(upper, target, bound)
            })?
            .join()
            .map_err(|_| io::Error::other("the write-back thread panicked"))?
    }
}

impl Drop for JobDisk {
    fn drop(&mut self) {
        // The overlay first; the file system under it goes with `fs`.
        let _ = rustix::mount::unmount(&self.merged, rustix::mount::UnmountFlags::DETACH);
        let _ = std::fs::remove_dir(&self.merged);
    }
}

/// File systems made ahead for the ids of a worker's pool, one each at most, in folders of their
/// own under `dir`: a job takes its id's, and the next is made after the job, off its path.
///
/// `dir` is the worker's own: several workers of one deployment share `state/disks`, each in a
/// folder of its own held by a lock for as long as it lives, so that a worker starting (or
/// started again after a crash) clears only what dead workers left, never a live one's disks.
#[derive(Debug)]
pub struct Spares {
    dir: PathBuf,
    /// The lock that marks `dir` as a live worker's, and its path.
    lock: Option<(std::fs::File, PathBuf)>,
    limit: u64,
    ready: std::sync::Mutex<std::collections::HashMap<u32, Prepared>>,
    serial: std::sync::atomic::AtomicU64,
    closed: std::sync::atomic::AtomicBool,
}

impl Spares {
    /// Spares of `limit` bytes in a folder of this worker's own under `root` (the deployment's
    /// `state/disks`): what workers killed outright left there goes first.
    pub fn new(root: &Path, limit: u64) -> Spares {
        sweep_dead(root);
        let (dir, lock) = own_folder(root);
        Spares {
            dir,
            lock,
            limit,
            ready: std::sync::Mutex::default(),
            serial: std::sync::atomic::AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Removes every spare, and any made after: the worker is stopping. Its folder and lock go
    /// too once nothing is left in it.
    pub fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut ready) = self.ready.lock() {
            ready.clear();
        }
        if std::fs::remove_dir(&self.dir).is_ok()
            && let Some((_, path)) = &self.lock
        {
            let _ = std::fs::remove_file(path);
        }
    }

    /// `id`'s file system made ahead, or one made now.
    pub fn take(&self, id: u32) -> io::Result<Prepared> {
        let ready = self.ready.lock().ok().and_then(|mut r| r.remove(&id));
        match ready {
            Some(fs) => Ok(fs),
            None => self.make(id),
        }
    }

    /// Keeps `fs` (emptied, see [`JobDisk::recycle`]) for `id`'s next job, unless it has one or
    /// the worker is stopping.
    pub fn put(&self, id: u32, fs: Prepared) {
        if let Ok(mut ready) = self.ready.lock()
            && !self.closed.load(std::sync::atomic::Ordering::SeqCst)
        {
            ready.entry(id).or_insert(fs);
        }
    }

    /// Makes `id`'s next file system, unless it has one.
    pub fn prepare(&self, id: u32) -> io::Result<()> {
        if self.ready.lock().is_ok_and(|r| r.contains_key(&id)) {
            return Ok(());
        }
        let fs = self.make(id)?;
        if let Ok(mut ready) = self.ready.lock()
            && !self.closed.load(std::sync::atomic::Ordering::SeqCst)
        {
            ready.entry(id).or_insert(fs);
        }
        Ok(())
    }

    fn make(&self, id: u32) -> io::Result<Prepared> {
        let _ = std::fs::create_dir_all(&self.dir);
        let serial = self
            .serial
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut fs = Prepared::make(&self.dir.join(format!("{id}-{serial}")), self.limit)?;
        fs.owns_place = true;
        Ok(fs)
    }
}

/// Clears the folders under `root` of workers that are gone: a folder whose lock file is missing
/// (an older version's, or a worker that died before it took one) or free. Each is unmounted
/// below and removed while its lock is held here, so no worker starting at the same time takes it.
fn sweep_dead(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let is_folder = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_folder {
            continue;
        }
        let mut lock_name = name.clone();
        lock_name.push(".lock");
        let lock_path = root.join(&lock_name);
        let held = if lock_path.exists() {
            match crate::identity::try_lock(&lock_path) {
                Ok(Some(lock)) => Some(lock),
                // A live worker's, or one that cannot be judged: left alone.
                Ok(None) | Err(_) => continue,
            }
        } else {
            None
        };
        let folder = entry.path();
        crate::identity::sweep(&folder);
        let _ = std::fs::remove_dir_all(&folder);
        if held.is_some() {
            let _ = std::fs::remove_file(&lock_path);
        }
    }
}

/// This worker's folder under `root`, named by its process and start, with its lock held (taken
/// before the folder is made, so a sweep never finds the folder unlocked). Without a lock (a
/// folder that cannot be written) the folder is still used: jobs make their disk in it or fail.
fn own_folder(root: &Path) -> (PathBuf, Option<(std::fs::File, PathBuf)>) {
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root);
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!("w{}-{start}", std::process::id());
    let lock_path = root.join(format!("{name}.lock"));
    let lock = crate::identity::try_lock(&lock_path)
        .ok()
        .flatten()
        .map(|l| (l, lock_path));
    let dir = root.join(name);
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    (dir, lock)
}

/// Runs a host program with fixed arguments (none from the job), its output dropped.
fn run(command: &mut Command, what: &str) -> io::Result<()> {
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("{what} failed ({status})")))
    }
}

/// A host program the worker runs for a job's disk, with an environment of its own (a path to
/// find its own helpers, nothing of the worker's: the worker's holds the provider's key and what
/// it forwards to jobs).
fn helper(program: PathBuf) -> Command {
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LC_ALL", "C");
    command
}

/// Bytes in use on the file system of `fd`.
fn used(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let s = rustix::fs::fstatfs(fd)?;
    let block = u64::try_from(s.f_bsize).unwrap_or(0);
    Ok(s.f_blocks.saturating_sub(s.f_bfree).saturating_mul(block))
}

fn open_dir<Fd: AsFd>(at: Fd, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// What an entry of the job's writes is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The overlay's mark of an entry the job removed (a character device 0:0).
    Removed,
    Folder,
    File,
    Link,
    Other,
}

fn kind(st: &rustix::fs::Stat) -> Kind {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::CharacterDevice if st.st_rdev == 0 => Kind::Removed,
        FileType::Directory => Kind::Folder,
        FileType::RegularFile => Kind::File,
        FileType::Symlink => Kind::Link,
        _ => Kind::Other,
    }
}

/// Whether the overlay marked a folder of the job's as replacing the one below.
fn opaque(folder: BorrowedFd<'_>) -> bool {
    let mut value = [0u8; 4];
    matches!(
        rustix::fs::fgetxattr(folder, "user.overlay.opaque", &mut value),
        Ok(n) if n >= 1 && value[0] == b'y'
    )
}

/// A folder being copied: what the job wrote in it, and where it goes.
struct Frame {
    from: rustix::fs::Dir,
    from_fd: OwnedFd,
    to: std::rc::Rc<OwnedFd>,
    /// The permissions the folder gets once it is filled (it is open to its owner till then);
    /// `None` for the top, which keeps its own.
    mode: Option<u32>,
}

/// What a write-back may carry: its data's bytes and its names.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    pub bytes: u64,
    pub entries: u64,
}

/// The data bytes a file of the job's holds on its disk (a hole holds none).
fn held(st: &rustix::fs::Stat) -> u64 {
    u64::try_from(st.st_blocks)
        .unwrap_or(0)
        .saturating_mul(512)
        .min(u64::try_from(st.st_size).unwrap_or(0))
}

/// The identity of a file the job linked under several names.
fn inode(st: &rustix::fs::Stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

/// Walks the overlay's upper layer `from` as [`apply`] will, and refuses it when it holds more
/// than `bound`: its files' data (a file linked under several names counted once, as the copy
/// links them) and its names.
fn measure(from: &OwnedFd, bound: Bound) -> Result<(), WriteBackError> {
    let past = |what, bound| WriteBackError::PastBound {
        what,
        bound,
        partial: false,
    };
    let mut entries = 0u64;
    let mut bytes = 0u64;
    let mut linked = std::collections::HashSet::new();
    let top = rustix::fs::openat(from, ".", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
    // Each folder open, and the permissions to give it back once read (one the job closed to
    // its owner is opened for the walk, and the copy must see it as the job left it).
    let mut stack = vec![(rustix::fs::Dir::read_from(&top)?, top, None)];
    loop {
        let depth = stack.len();
        let Some((dir, fd, _)) = stack.last_mut() else {
            break;
        };
        let Some(entry) = dir.read() else {
            if let Some((_, fd, Some(mode))) = stack.pop() {
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
            }
            continue;
        };
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes()).to_owned();
        if name == "." || name == ".." {
            continue;
        }
        let st = rustix::fs::statat(&*fd, &name, AtFlags::SYMLINK_NOFOLLOW)?;
        match kind(&st) {
            Kind::Other => continue,
            Kind::Folder if depth > MAX_DEPTH => continue,
            Kind::Folder => {
                let sub = open_readable(fd, &name, true)?;
                let mode = st.st_mode & 0o7777;
                let changed = rustix::fs::fstat(&sub)?.st_mode & 0o7777 != mode;
                let dir = rustix::fs::Dir::read_from(&sub)?;
                stack.push((dir, sub, changed.then_some(mode)));
            }
            Kind::File if st.st_nlink > 1 && !linked.insert(inode(&st)) => {}
            Kind::File => bytes = bytes.saturating_add(held(&st)),
            Kind::Removed | Kind::Link => {}
        }
        entries += 1;
        if entries > bound.entries {
            return Err(past("entries", bound.entries));
        }
        if bytes > bound.bytes {
            return Err(past("bytes", bound.bytes));
        }
    }
    Ok(())
}

/// Copies the overlay's upper layer `from` into `to`, as the caller: the job's files and links
/// replace what was there, its folders are merged (or replace what was there when the job made
/// them anew), and what it removed is removed; a file the job linked under several names is
/// written once and linked under the others. Iterative, with two descriptors a level. Past
/// `bound` (which [`measure`] checked before: only a tree of more linked files than the copy
/// keeps open can pass it here) it stops, naming the partial state.
fn apply(from: OwnedFd, to: OwnedFd, bound: Bound) -> Result<Applied, WriteBackError> {
    let mut copying = Copying::default();
    let mut stack = vec![Frame {
        from: rustix::fs::Dir::read_from(&from)?,
        from_fd: from,
        to: std::rc::Rc::new(to),
        mode: None,
    }];
    loop {
        let depth = stack.len();
        let Some(frame) = stack.last_mut() else {
            break;
        };
        let Some(entry) = frame.from.read() else {
            if let Some(mode) = frame.mode {
                rustix::fs::fchmod(&*frame.to, Mode::from_raw_mode(mode))?;
            }
            stack.pop();
            continue;
        };
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes()).to_owned();
        if name == "." || name == ".." {
            continue;
        }
        let st = rustix::fs::statat(&frame.from_fd, &name, AtFlags::SYMLINK_NOFOLLOW)?;
        match kind(&st) {
            Kind::Removed => {
                if remove(frame.to.as_fd(), &name)? {
                    copying.done.removed += 1;
                }
            }
            Kind::Other => copying.done.skipped += 1,
            Kind::Folder if depth > MAX_DEPTH => copying.done.skipped += 1,
            Kind::Folder => {
                let next = copying.folder(frame, &name, &st)?;
                stack.push(next);
            }
            Kind::File | Kind::Link => copying.file(frame, &name, &st)?,
        }
        copying.within(bound, stack.len())?;
    }
    Ok(copying.done)
}

/// What [`apply`] has done so far, and the files it wrote that the job linked under several
/// names.
#[derive(Default)]
struct Copying {
    done: Applied,
    /// The first name each linked file was written under: its folder and name.
    firsts: std::collections::HashMap<(u64, u64), (std::rc::Rc<OwnedFd>, std::ffi::OsString)>,
    /// Numbers the temporary names.
    serial: u64,
}

impl Copying {
    /// The job's folder `name` in `frame`: merged into the folder there, or made anew (when the
    /// job made it anew, or something else is there); the frame to copy it in.
    fn folder(
        &mut self,
        frame: &Frame,
        name: &OsStr,
        st: &rustix::fs::Stat,
    ) -> Result<Frame, WriteBackError> {
        let from_fd = open_readable(&frame.from_fd, name, true)?;
        let there = rustix::fs::statat(&*frame.to, name, AtFlags::SYMLINK_NOFOLLOW).ok();
        let keep = there.is_some_and(|t| kind(&t) == Kind::Folder && !opaque(from_fd.as_fd()));
        if !keep {
            if remove(frame.to.as_fd(), name)? {
                self.done.removed += 1;
            }
            rustix::fs::mkdirat(&*frame.to, name, Mode::from_raw_mode(0o700))?;
        }
        let to = open_dir(&*frame.to, name)?;
        let mode = st.st_mode & KEPT_MODE;
        rustix::fs::fchmod(&to, Mode::from_raw_mode(mode | 0o700))?;
        let from = rustix::fs::Dir::read_from(&from_fd)?;
        Ok(Frame {
            from,
            from_fd,
            to: std::rc::Rc::new(to),
            mode: Some(mode),
        })
    }

    /// The job's file or link `name` in `frame`: linked to the first name of a file the job
    /// linked under several, else written.
    fn file(
        &mut self,
        frame: &Frame,
        name: &OsStr,
        st: &rustix::fs::Stat,
    ) -> Result<(), WriteBackError> {
        self.serial += 1;
        let many = kind(st) == Kind::File && st.st_nlink > 1;
        let first = many.then(|| self.firsts.get(&inode(st))).flatten();
        let linked = match first {
            Some((dir, first)) => link(dir, first, &frame.to, name, self.serial)?,
            None => false,
        };
        if linked {
            self.done.linked += 1;
        } else {
            let bytes = put(&frame.from_fd, &frame.to, name, st, self.serial)?;
            self.done.bytes += bytes;
            if many && self.firsts.len() < MAX_LINKED {
                self.firsts
                    .entry(inode(st))
                    .or_insert_with(|| (frame.to.clone(), name.to_owned()));
            }
        }
        self.done.files += 1;
        Ok(())
    }

    /// Stops the copy, naming its partial state, once it is past `bound` (`open` folders deep).
    fn within(&self, bound: Bound, open: usize) -> Result<(), WriteBackError> {
        let done = &self.done;
        let entries = done.files + done.removed + u64::try_from(open).unwrap_or(0);
        if done.bytes > bound.bytes || entries > bound.entries.saturating_add(MAX_DEPTH as u64) {
            let (what, bound) = match done.bytes > bound.bytes {
                true => ("bytes", bound.bytes),
                false => ("entries", bound.entries),
            };
            return Err(WriteBackError::PastBound {
                what,
                bound,
                partial: true,
            });
        }
        Ok(())
    }
}

/// Writes `name` in `to` as another name of the file already written as `first` in `dir`, over
/// what was there (a folder there is removed first). `false` when it cannot be linked (the
/// caller copies it instead).
fn link(dir: &OwnedFd, first: &OsStr, to: &OwnedFd, name: &OsStr, serial: u64) -> io::Result<bool> {
    let temp = free_name(to, serial)?;
    if rustix::fs::linkat(dir, first, to, &temp, AtFlags::empty()).is_err() {
        return Ok(false);
    }
    into_place(to, &temp, name)?;
    Ok(true)
}

/// Renames what was written as `temp` in `to` over `name` (a folder there is removed first); on
/// failure `temp` is removed.
fn into_place(to: &OwnedFd, temp: &Path, name: &OsStr) -> io::Result<()> {
    if rustix::fs::statat(to, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|t| kind(&t) == Kind::Folder)
    {
        remove(to.as_fd(), name)?;
    }
    if let Err(e) = rustix::fs::renameat(to, temp, to, name) {
        let _ = rustix::fs::unlinkat(to, temp, AtFlags::empty());
        return Err(e.into());
    }
    Ok(())
}

/// Opens the job's folder or file `name` to read, making it readable by its owner first if the
/// job took that away (the caller is the job's id, the owner of all it wrote).
fn open_readable(at: &OwnedFd, name: &OsStr, folder: bool) -> io::Result<OwnedFd> {
    let flags = if folder {
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
    } else {
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC
    };
    match rustix::fs::openat(at, name, flags, Mode::empty()) {
        Err(rustix::io::Errno::ACCESS) => {
            let mode = if folder { 0o700 } else { 0o600 };
            rustix::fs::chmodat(at, name, Mode::from_raw_mode(mode), AtFlags::empty())?;
            Ok(rustix::fs::openat(at, name, flags, Mode::empty())?)
        }
        other => Ok(other?),
    }
}

/// Writes the job's file or link `name` into `to` under a name of its own, then renames it over
/// what was there (a folder there is removed first). Returns the bytes written.
///
/// Not `config::files`' atomic write (`StagedStream`, `write_atomic`), though it is the same
/// write-temp-then-rename: those take paths, and a path into the job's workspace could pass
/// through a link the job left. Here every step is made relative to the descriptors of the
/// folders being copied (`openat`, `renameat`), so nothing the job wrote is followed.
fn put(
    from: &OwnedFd,
    to: &OwnedFd,
    name: &OsStr,
    st: &rustix::fs::Stat,
    serial: u64,
) -> io::Result<u64> {
    let temp = free_name(to, serial)?;
    let bytes = if kind(st) == Kind::Link {
        let target = rustix::fs::readlinkat(from, name, Vec::new())?;
        rustix::fs::symlinkat(target.as_c_str(), to, &temp)?;
        0
    } else {
        let source = open_readable(from, name, false)?;
        let made = rustix::fs::openat(
            to,
            &temp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let source = std::fs::File::from(source);
        let made = std::fs::File::from(made);
        let copied = match copy_data(&source, &made) {
            Ok(n) => n,
            Err(e) => {
                let _ = rustix::fs::unlinkat(to, &temp, AtFlags::empty());
                return Err(e);
            }
        };
        rustix::fs::fchmod(&made, Mode::from_raw_mode(st.st_mode & KEPT_MODE))?;
        let times = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: st.st_atime,
                tv_nsec: st.st_atime_nsec as _,
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: st.st_mtime,
                tv_nsec: st.st_mtime_nsec as _,
            },
        };
        let _ = rustix::fs::futimens(&made, &times);
        copied
    };
    into_place(to, &temp, name)?;
    Ok(bytes)
}

/// Copies what `from` holds into `to`, leaving its holes holes: only the data the job's disk
/// holds is read and written, so a sparse file the size of a host's disk costs no more than the
/// bytes the job wrote. Returns the bytes written.
fn copy_data(from: &std::fs::File, to: &std::fs::File) -> io::Result<u64> {
    use rustix::fs::SeekFrom;
    use std::os::unix::fs::FileExt as _;
    let size = from.metadata()?.len();
    let mut buf = vec![0u8; 1 << 17];
    let mut copied = 0u64;
    let mut at = 0u64;
    while at < size {
        let start = match rustix::fs::seek(from, SeekFrom::Data(at)) {
            Ok(start) => start,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = rustix::fs::seek(from, SeekFrom::Hole(start))?.min(size);
        let mut offset = start;
        while offset < end {
            let want = usize::try_from(end - offset)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let n = from.read_at(&mut buf[..want], offset)?;
            if n == 0 {
                break;
            }
            to.write_all_at(&buf[..n], offset)?;
            offset += n as u64;
            copied += n as u64;
        }
        at = end.max(start + 1);
    }
    to.set_len(size)?;
    Ok(copied)
}

/// A name in `to` that nothing has, for a file being written.
fn free_name(to: &OwnedFd, serial: u64) -> io::Result<PathBuf> {
    for attempt in 0..64u32 {
        let name = PathBuf::from(format!(".pi-dispatch-write-back-{serial}-{attempt}"));
        match rustix::fs::statat(to, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(rustix::io::Errno::NOENT) => return Ok(name),
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
    }
    Err(io::Error::other("no free name to write a file under"))
}

/// Removes `name` from `at`, a folder with all it holds, never following a link. Returns whether
/// there was anything.
fn remove(at: BorrowedFd<'_>, name: &OsStr) -> io::Result<bool> {
    let st = match rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if kind(&st) != Kind::Folder {
        rustix::fs::unlinkat(at, name, AtFlags::empty())?;
        return Ok(true);
    }
    // Depth first, a descriptor a level: each folder emptied, then removed from its parent.
    let top = open_dir(at, name)?;
    let mut stack: Vec<(rustix::fs::Dir, OwnedFd)> = vec![(rustix::fs::Dir::read_from(&top)?, top)];
    let mut names: Vec<std::ffi::OsString> = Vec::new();
    while let Some((dir, fd)) = stack.last_mut() {
        match dir.read() {
            Some(entry) => {
                let entry = entry?;
                let child = OsStr::from_bytes(entry.file_name().to_bytes()).to_owned();
                if child == "." || child == ".." {
                    continue;
                }
                let st = rustix::fs::statat(&*fd, &child, AtFlags::SYMLINK_NOFOLLOW)?;
                if kind(&st) == Kind::Folder {
                    let sub = open_dir(&*fd, &child)?;
                    let dir = rustix::fs::Dir::read_from(&sub)?;
                    names.push(child);
                    stack.push((dir, sub));
                } else {
                    rustix::fs::unlinkat(&*fd, &child, AtFlags::empty())?;
                }
            }
            None => {
                stack.pop();
                let parent = match stack.last() {
                    Some((_, parent)) => parent.as_fd(),
                    None => at,
                };
                let done = names.pop();
                let done = done.as_deref().unwrap_or(name);
                rustix::fs::unlinkat(parent, done, AtFlags::REMOVEDIR)?;
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bound no test tree comes near.
    const LOOSE: Bound = Bound {
        bytes: u64::MAX,
        entries: u64::MAX,
    };

    fn fd(path: &Path) -> OwnedFd {
        open_dir(rustix::fs::CWD, path.as_os_str()).unwrap()
    }

    #[test]
    fn hard_links_come_back_as_links_and_are_measured_once() {
        use std::os::unix::fs::MetadataExt as _;
        let upper = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let u = upper.path();
        std::fs::create_dir(u.join("d")).unwrap();
        std::fs::write(u.join("big"), vec![7u8; 1 << 20]).unwrap();
        for n in 0..20 {
            std::fs::hard_link(u.join("big"), u.join(format!("d/link-{n}"))).unwrap();
        }
        // Measured, the twenty names hold the file's bytes once.
        let held = std::fs::metadata(u.join("big")).unwrap().blocks() * 512;
        let snug = Bound {
            bytes: held,
            entries: 100,
        };
        measure(&fd(u), snug).unwrap();
        let done = apply(fd(u), fd(target.path()), snug).unwrap();
        assert_eq!((done.files, done.linked), (21, 20), "{done:?}");
        assert_eq!(done.bytes, 1 << 20);
        let first = std::fs::metadata(target.path().join("big")).unwrap();
        assert_eq!(first.nlink(), 21);
        let other = std::fs::metadata(target.path().join("d/link-7")).unwrap();
        assert_eq!(other.ino(), first.ino());
        // The control: the same tree against a bound of less than the file is refused whole.
        let tight = Bound {
            bytes: held - 1,
            entries: 100,
        };
        assert!(matches!(
            measure(&fd(u), tight),
            Err(WriteBackError::PastBound {
                what: "bytes",
                partial: false,
                ..
            })
        ));
        let few = Bound {
            bytes: u64::MAX,
            entries: 20,
        };
        assert!(matches!(
            measure(&fd(u), few),
            Err(WriteBackError::PastBound {
                what: "entries",
                partial: false,
                ..
            })
        ));
    }

    #[test]
    fn no_entry_comes_back_writable_by_others_setuid_or_setgid() {
        use std::os::unix::fs::PermissionsExt as _;
        let upper = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let u = upper.path();
        std::fs::create_dir(u.join("open")).unwrap();
        std::fs::write(u.join("open/f"), "x").unwrap();
        std::fs::write(u.join("s"), "x").unwrap();
        let set = |p: &str, mode: u32| {
            std::fs::set_permissions(u.join(p), std::fs::Permissions::from_mode(mode)).unwrap();
        };
        std::fs::create_dir(u.join("closed")).unwrap();
        set("open/f", 0o666);
        set("s", 0o6777);
        set("open", 0o1777);
        set("closed", 0o000);
        // Measured first, as the write-back does: a folder closed to its owner stays closed.
        measure(&fd(u), LOOSE).unwrap();
        apply(fd(u), fd(target.path()), LOOSE).unwrap();
        let mode = |p: &str| {
            std::fs::symlink_metadata(target.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("open/f"), 0o664);
        assert_eq!(mode("s"), 0o775);
        assert_eq!(mode("open"), 0o775);
        assert_eq!(mode("closed"), 0o000);
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut all: Vec<String> = walk(dir, dir);
        all.sort();
        all
    }

    fn walk(root: &Path, dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                out.push(format!("{rel}/"));
                out.extend(walk(root, &p));
            } else if m.file_type().is_symlink() {
                out.push(format!(
                    "{rel} -> {}",
                    std::fs::read_link(&p).unwrap().display()
                ));
            } else {
                out.push(format!("{rel} = {}", std::fs::read_to_string(&p).unwrap()));
            }
        }
        out
    }

    /// The write-back alone, from a folder laid out as the overlay's upper layer would be (its
    /// whiteouts need root to make, so they are tried by the end-to-end tests).
    #[test]
    fn what_a_job_wrote_replaces_and_merges_into_the_workspace() {
        let upper = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let u = upper.path();
        let t = target.path();
        std::fs::create_dir_all(u.join("src/deep")).unwrap();
        std::fs::write(u.join("src/deep/new.rs"), "new").unwrap();
        std::fs::write(u.join("src/lib.rs"), "changed").unwrap();
        std::os::unix::fs::symlink("lib.rs", u.join("src/link")).unwrap();
        std::fs::write(u.join("was-a-folder"), "now a file").unwrap();
        std::fs::create_dir_all(t.join("src")).unwrap();
        std::fs::write(t.join("src/lib.rs"), "old").unwrap();
        std::fs::write(t.join("src/kept.rs"), "kept").unwrap();
        std::fs::create_dir_all(t.join("was-a-folder/inner")).unwrap();
        std::fs::write(t.join("was-a-folder/inner/f"), "gone").unwrap();
        // A link in the workspace where the job made a folder: replaced, never followed.
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), t.join("deep-link")).unwrap();
        std::fs::create_dir_all(u.join("deep-link")).unwrap();
        std::fs::write(u.join("deep-link/x"), "x").unwrap();
        let done = apply(
            open_dir(rustix::fs::CWD, u.as_os_str()).unwrap(),
            open_dir(rustix::fs::CWD, t.as_os_str()).unwrap(),
            LOOSE,
        )
        .unwrap();
        assert_eq!(
            entries(t),
            [
                "deep-link/",
                "deep-link/x = x",
                "src/",
                "src/deep/",
                "src/deep/new.rs = new",
                "src/kept.rs = kept",
                "src/lib.rs = changed",
                "src/link -> lib.rs",
                "was-a-folder = now a file",
            ]
        );
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        assert_eq!(done.files, 5);
        assert_eq!(done.skipped, 0);
    }

    #[test]
    fn a_sparse_file_is_written_back_as_sparse() {
        use std::os::unix::fs::{FileExt as _, MetadataExt as _};
        let upper = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let huge = std::fs::File::create(upper.path().join("huge")).unwrap();
        huge.set_len(1 << 40).unwrap();
        huge.write_all_at(b"data in the middle", 1 << 30).unwrap();
        drop(huge);
        let done = apply(
            open_dir(rustix::fs::CWD, upper.path().as_os_str()).unwrap(),
            open_dir(rustix::fs::CWD, target.path().as_os_str()).unwrap(),
            LOOSE,
        )
        .unwrap();
        let copy = target.path().join("huge");
        let meta = std::fs::metadata(&copy).unwrap();
        assert_eq!(meta.len(), 1 << 40);
        // Only the data was written: a block or so, not a terabyte.
        assert!(meta.blocks() * 512 < 1 << 20, "{} blocks", meta.blocks());
        assert!(done.bytes < 1 << 20, "{done:?}");
        let mut back = [0u8; 18];
        std::fs::File::open(&copy)
            .unwrap()
            .read_exact_at(&mut back, 1 << 30)
            .unwrap();
        assert_eq!(&back, b"data in the middle");
    }

    #[test]
    fn special_files_and_folders_past_the_depth_are_not_written_back() {
        let upper = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let u = upper.path();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            u.join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let mut deep = u.to_path_buf();
        for _ in 0..=MAX_DEPTH {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        let done = apply(
            open_dir(rustix::fs::CWD, u.as_os_str()).unwrap(),
            open_dir(rustix::fs::CWD, target.path().as_os_str()).unwrap(),
            LOOSE,
        )
        .unwrap();
        assert_eq!(done.skipped, 2);
        assert!(!target.path().join("fifo").exists());
        let mut kept = target.path().to_path_buf();
        for _ in 0..MAX_DEPTH {
            kept.push("d");
        }
        assert!(kept.is_dir());
        assert!(!kept.join("d").exists());
    }
}
