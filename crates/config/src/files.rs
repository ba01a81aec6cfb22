//! Reading a configuration file whole, safely: never through a link, never more than a cap, and with
//! failures sorted into those that are final (missing, a link, not a file, too large) and those that
//! may pass on a retry (an I/O error such as EIO).
//!
//! And writing one, the one way pi-dispatch writes a file that must never be seen half-written: to a
//! temporary file beside its target, flushed to disk, then renamed into place (replacing what was
//! there) or linked there (only if nothing is), so that a crash at any moment leaves either the old
//! file or the new one.
//!
//! And how much room the deployment's disk has left ([`free_bytes`], judged by [`Room::of`]).
//!
//! This is the one place the config crate touches the file system; everything else parses bytes.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::fs::OFlags;

/// Open flags as `OpenOptions::custom_flags` takes them.
fn flags(f: OFlags) -> i32 {
    f.bits() as i32
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error("not found")]
    Missing,
    #[error("is a link; pi-dispatch does not follow links in configuration")]
    Link,
    #[error("is not a regular file")]
    NotAFile,
    #[error("is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("cannot be read ({0})")]
    Io(io::ErrorKind),
}

impl ReadError {
    /// Whether the same read may succeed later (a transient I/O error), rather than being final.
    pub fn may_pass_on_retry(&self) -> bool {
        matches!(self, ReadError::Io(kind) if !matches!(kind, io::ErrorKind::PermissionDenied))
    }

    pub fn code(&self) -> &'static str {
        match self {
            ReadError::Missing => "file-missing",
            ReadError::Link => "file-link",
            ReadError::NotAFile => "file-not-regular",
            ReadError::TooLarge { .. } => "file-too-large",
            ReadError::Io(_) => "file-unreadable",
        }
    }
}

/// Reads `path` whole, refusing a link at its last component and anything over `limit` bytes.
pub fn read_file(path: &Path, limit: usize) -> Result<Vec<u8>, ReadError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags(OFlags::NOFOLLOW | OFlags::NONBLOCK))
        .open(path)
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ReadError::Missing,
            // O_NOFOLLOW on a link fails with ELOOP.
            _ if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
                ReadError::Link
            }
            kind => ReadError::Io(kind),
        })?;
    let meta = file.metadata().map_err(|e| ReadError::Io(e.kind()))?;
    if !meta.is_file() {
        return Err(ReadError::NotAFile);
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0).min(limit));
    file.take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ReadError::Io(e.kind()))?;
    if bytes.len() > limit {
        return Err(ReadError::TooLarge { limit });
    }
    Ok(bytes)
}

/// Temporary files start with this, so a later run can recognise leftovers of a crash.
pub const TEMP_PREFIX: &str = ".pi-dispatch-tmp.";

/// A fresh temporary path beside `target`.
pub fn temp_path(target: &Path) -> io::Result<PathBuf> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let dir = target
        .parent()
        .ok_or_else(|| io::Error::other("a file needs a folder"))?;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    Ok(dir.join(format!("{TEMP_PREFIX}{}.{n}", std::process::id())))
}

/// The variable of the crash hook: set to `mid-write` or `before-rename`, the process aborts at that
/// point of every file write, as a crash would, so that tests can see what a crash leaves behind.
pub const CRASH_HOOK: &str = "PI_DISPATCH_TEST_CRASH";

fn crash_point(point: &str) {
    if std::env::var(CRASH_HOOK).is_ok_and(|v| v == point) {
        std::process::abort();
    }
}

fn write_temp(target: &Path, bytes: &[u8], mode: u32) -> io::Result<PathBuf> {
    let tmp = temp_path(target)?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(flags(OFlags::NOFOLLOW))
        .open(&tmp)?;
    let (first, second) = bytes.split_at(bytes.len() / 2);
    let written = file
        .write_all(first)
        .and_then(|()| file.flush())
        .map(|()| crash_point("mid-write"))
        .and_then(|()| file.write_all(second))
        .and_then(|()| file.sync_all());
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(tmp)
}

/// Flushes a folder (its entries) to disk.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A file written in full beside its target, not yet in place.
#[derive(Debug)]
pub struct StagedFile {
    tmp: PathBuf,
    target: PathBuf,
}

impl StagedFile {
    /// Writes `bytes` to a temporary file beside `target` and flushes it to disk.
    pub fn write(target: &Path, bytes: &[u8], mode: u32) -> io::Result<StagedFile> {
        Ok(StagedFile {
            tmp: write_temp(target, bytes, mode)?,
            target: target.to_owned(),
        })
    }

    /// Renames the file into place (replacing what was there) and flushes the folder.
    pub fn commit(self) -> io::Result<()> {
        crash_point("before-rename");
        fs::rename(&self.tmp, &self.target)?;
        sync_dir(self.target.parent().unwrap_or(Path::new(".")))
    }

    /// Removes the temporary file: the target is left as it was.
    pub fn discard(self) {
        let _ = fs::remove_file(&self.tmp);
    }
}

/// A file written as it goes (a job's transcript, line by line) beside its target, put in place
/// whole by [`StagedStream::commit`] the way [`write_atomic`] puts a file: until then, readers of
/// the target see what was there before.
#[derive(Debug)]
pub struct StagedStream {
    file: File,
    staged: StagedFile,
}

impl StagedStream {
    /// Starts the file beside `target` with `mode` (never through a link).
    pub fn create(target: &Path, mode: u32) -> io::Result<StagedStream> {
        let tmp = temp_path(target)?;
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(flags(OFlags::NOFOLLOW))
            .open(&tmp)?;
        Ok(StagedStream {
            file,
            staged: StagedFile {
                tmp,
                target: target.to_owned(),
            },
        })
    }

    /// Where the bytes go.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Flushes the file to disk, renames it into place and flushes the folder.
    pub fn commit(self) -> io::Result<()> {
        self.file.sync_all()?;
        self.staged.commit()
    }
}

/// Replaces `target` with `bytes` atomically (temp file, fsync, rename, fsync of the folder).
pub fn write_atomic(target: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let staged = StagedFile::write(target, bytes, mode)?;
    let tmp = staged.tmp.clone();
    staged.commit().inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// Writes `bytes` at `target` only if nothing is there: returns false, writing nothing, when the
/// path exists (as a file, folder or link). Never a half file: the content is complete before the
/// name appears.
pub fn create_new(target: &Path, bytes: &[u8], mode: u32) -> io::Result<bool> {
    let tmp = write_temp(target, bytes, mode)?;
    // A hard link fails if the name exists, unlike a rename, which would replace it.
    let linked = fs::hard_link(&tmp, target);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            sync_dir(target.parent().unwrap_or(Path::new(".")))?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// The space left on the file system holding `path` for a writer without privileges, in bytes.
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let fs = rustix::fs::statvfs(path)?;
    Ok(fs.f_bavail.saturating_mul(fs.f_frsize))
}

/// The bytes the files under `path` take on disk (their allocated blocks, as `du` counts them),
/// without following a link or entering another file system (a job's mounts). What cannot be
/// read is left out.
pub fn used_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(top) = fs::symlink_metadata(path) else {
        return 0;
    };
    let mut total = 0u64;
    let mut folders = vec![path.to_owned()];
    total = total.saturating_add(top.blocks().saturating_mul(512));
    while let Some(folder) = folders.pop() {
        let Ok(entries) = fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != top.dev() {
                continue;
            }
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                folders.push(entry.path());
            }
        }
    }
    total
}

/// How much room the state folder's disk has, against `PI_DISK_WARN_MB` and `PI_DISK_MIN_MB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    Enough,
    /// Below the warning level: doctor warns, jobs still start.
    Low,
    /// Below the minimum: doctor fails, and the worker starts no job until there is room again.
    NearlyFull,
}

impl Room {
    /// The room `free` bytes leave, with the warning level `warn` and the minimum `min` (in bytes).
    /// Pure.
    pub fn of(free: u64, warn: u64, min: u64) -> Room {
        if free < min {
            Room::NearlyFull
        } else if free < warn {
            Room::Low
        } else {
            Room::Enough
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_file_and_sorts_failures() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mcp.json");
        std::fs::write(&file, b"{}").unwrap();
        assert_eq!(read_file(&file, 10).unwrap(), b"{}");
        assert!(matches!(
            read_file(&file, 1),
            Err(ReadError::TooLarge { limit: 1 })
        ));
        assert!(matches!(
            read_file(&dir.path().join("none"), 10),
            Err(ReadError::Missing)
        ));
        assert!(matches!(
            read_file(dir.path(), 10),
            Err(ReadError::NotAFile)
        ));
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let err = read_file(&link, 10).unwrap_err();
        assert!(matches!(err, ReadError::Link), "{err:?}");
        assert!(!err.may_pass_on_retry());
        assert!(ReadError::Io(io::ErrorKind::Other).may_pass_on_retry());
    }

    #[test]
    fn write_atomic_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("mcp.json");
        fs::write(&target, b"old").unwrap();
        write_atomic(&target, b"new", 0o644).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn the_bytes_used_are_counted_without_following_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big"), vec![7u8; 4 << 20]).unwrap();
        let before = used_bytes(dir.path());
        std::fs::create_dir(dir.path().join("job")).unwrap();
        std::fs::write(dir.path().join("job/file"), vec![1u8; 1 << 20]).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("job/link")).unwrap();
        let after = used_bytes(dir.path());
        let grown = after - before;
        assert!(grown >= 1 << 20, "{grown}");
        assert!(grown < 3 << 20, "the link was followed: {grown}");
        assert_eq!(used_bytes(&dir.path().join("missing")), 0);
    }

    #[test]
    fn the_room_left_is_judged_against_both_levels() {
        let mib = 1 << 20;
        assert_eq!(Room::of(5000 * mib, 4096 * mib, 1024 * mib), Room::Enough);
        assert_eq!(Room::of(2000 * mib, 4096 * mib, 1024 * mib), Room::Low);
        assert_eq!(
            Room::of(1000 * mib, 4096 * mib, 1024 * mib),
            Room::NearlyFull
        );
        // A minimum above the warning level: nearly full is what counts.
        assert_eq!(
            Room::of(3000 * mib, 1024 * mib, 4096 * mib),
            Room::NearlyFull
        );
        assert_eq!(Room::of(0, 0, 0), Room::Enough);
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        assert!(free_bytes(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn create_new_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join(".env");
        assert!(create_new(&target, b"first", 0o600).unwrap());
        assert!(!create_new(&target, b"second", 0o600).unwrap());
        assert_eq!(fs::read(&target).unwrap(), b"first");
        // Not through a link either: the link stays, its target is untouched.
        let other = dir.path().join("other");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &other).unwrap();
        assert!(!create_new(&other, b"x", 0o600).unwrap());
        assert!(!dir.path().join("nowhere").exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
