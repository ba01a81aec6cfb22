//! File effects that never leave a half-written file and never follow a link.
//!
//! Every write goes to a temporary file beside its target, is flushed to disk, and is then renamed
//! into place, so a crash at any moment leaves either the old file or the new one.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use config::files::{CRASH_HOOK, StagedFile, TEMP_PREFIX, create_new, write_atomic};
use config::files::{sync_dir, temp_path};

/// Removes `path` if it is there; true when something was removed.
pub fn remove_file_if_present(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// What is at a path, without following a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Missing,
    File,
    Dir,
    Link,
    Other,
}

pub fn kind(path: &Path) -> io::Result<Kind> {
    // `dir/` would make lstat look through a link named `dir`: judge the path without the slash.
    let path: PathBuf = path.components().collect();
    match fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_symlink() => Ok(Kind::Link),
        Ok(m) if m.is_file() => Ok(Kind::File),
        Ok(m) if m.is_dir() => Ok(Kind::Dir),
        Ok(_) => Ok(Kind::Other),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Kind::Missing),
        Err(e) => Err(e),
    }
}

/// Removes leftovers of an interrupted write in `dir`: files and folders named with
/// [`TEMP_PREFIX`] (never following a link).
pub fn remove_leftovers(dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            continue;
        }
        let kind = entry.file_type()?;
        if kind.is_dir() {
            fs::remove_dir_all(entry.path())?;
        } else {
            fs::remove_file(entry.path())?;
        }
        removed += 1;
    }
    Ok(removed)
}

/// The largest single file a tree copy takes (a skill's file is small; this bounds a mistake).
pub const COPY_LIMIT: usize = 64 * 1024 * 1024;

/// What a tree copy did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Copied {
    pub files: usize,
    /// Links met in the source, relative to it: never followed, never copied.
    pub skipped_links: Vec<PathBuf>,
    /// Entries that are neither file, folder nor link (sockets, FIFOs), relative to the source.
    pub skipped_other: Vec<PathBuf>,
}

/// Copies the folder `src` to `dst` (which must not exist), skipping links and special files.
/// Files keep their permission bits.
pub fn copy_tree(src: &Path, dst: &Path) -> io::Result<Copied> {
    let mut copied = Copied::default();
    copy_into(src, dst, Path::new(""), &mut copied)?;
    Ok(copied)
}

fn copy_into(src: &Path, dst: &Path, rel: &Path, copied: &mut Copied) -> io::Result<()> {
    fs::create_dir(dst)?;
    let mut entries: Vec<fs::DirEntry> = fs::read_dir(src)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(fs::DirEntry::file_name);
    for entry in entries {
        let name = entry.file_name();
        let rel = rel.join(&name);
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            copied.skipped_links.push(rel);
        } else if kind.is_dir() {
            copy_into(&entry.path(), &dst.join(&name), &rel, copied)?;
        } else if kind.is_file() {
            let bytes = config::files::read_file(&entry.path(), COPY_LIMIT)
                .map_err(|e| io::Error::other(format!("{} {e}", rel.display())))?;
            let mode = entry.metadata()?.permissions().mode() & 0o777;
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(dst.join(&name))?;
            file.write_all(&bytes)?;
            copied.files += 1;
        } else {
            copied.skipped_other.push(rel);
        }
    }
    Ok(())
}

/// Puts the folder `staged` (a sibling of `target`) in place of `target` in one step: when a folder
/// is there, the two are exchanged atomically (`renameat2` with `RENAME_EXCHANGE`) and the old one,
/// now under the temporary name, is removed. A crash leaves the old folder or the new one in place,
/// and at most a temporary folder that the next run removes.
pub fn replace_dir(staged: &Path, target: &Path) -> io::Result<()> {
    match kind(target)? {
        Kind::Missing => fs::rename(staged, target)?,
        Kind::Dir => {
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                staged,
                rustix::fs::CWD,
                target,
                rustix::fs::RenameFlags::EXCHANGE,
            )?;
            fs::remove_dir_all(staged)?;
        }
        _ => return Err(io::Error::other("the target is not a folder")),
    }
    sync_dir(target.parent().unwrap_or(Path::new(".")))
}

/// An exclusive lock on a folder, held until dropped: one import at a time per overlay.
pub struct FolderLock {
    _file: File,
}

/// The lock file's name: not a temporary file, so leftover cleaning never touches it.
pub const LOCK_FILE: &str = ".pi-dispatch.lock";

impl FolderLock {
    /// Takes the lock of `dir`, or fails at once with `WouldBlock` when another process holds it.
    pub fn take(dir: &Path) -> io::Result<FolderLock> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(dir.join(LOCK_FILE))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
        Ok(FolderLock { _file: file })
    }
}

/// A fresh temporary path beside `target`, for staging a folder before [`replace_dir`].
pub fn staging_path(target: &Path) -> io::Result<PathBuf> {
    temp_path(target)
}

/// Removes the folder at `path` if it is there (not following a link); true when removed.
pub fn remove_dir_if_present(path: &Path) -> io::Result<bool> {
    match kind(path)? {
        Kind::Dir => {
            fs::remove_dir_all(path)?;
            Ok(true)
        }
        Kind::Missing => Ok(false),
        _ => Err(io::Error::other("not a folder")),
    }
}

/// Hard-links (or copies, across file systems) every file of `src` into `dst`; links are skipped.
pub fn link_tree(
    src: &Path,
    dst: &Path,
    files: &mut usize,
    progress: &mut dyn FnMut(&str),
) -> io::Result<()> {
    fs::create_dir(dst)?;
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let to = dst.join(entry.file_name());
        if kind.is_dir() {
            link_tree(&entry.path(), &to, files, progress)?;
        } else if kind.is_file() {
            if fs::hard_link(entry.path(), &to).is_err() {
                fs::copy(entry.path(), &to)?;
            }
            *files += 1;
            if (*files).is_multiple_of(5000) {
                progress(&format!("      {files} files"));
            }
        }
    }
    Ok(())
}

/// Copies `src` into `dst` (made): files of any size with their modes, links as links, folders
/// 0755 (unlike [`copy_tree`], which reads the operator's files, bounded, and skips links). Every
/// file a copy of its own, however `src` shares its files.
pub fn copy_image_tree(src: &Path, dst: &Path) -> io::Result<()> {
    fs::create_dir(dst)?;
    fs::set_permissions(dst, fs::Permissions::from_mode(0o755))?;
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let to = dst.join(entry.file_name());
        if kind.is_dir() {
            copy_image_tree(&entry.path(), &to)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(entry.path())?, &to)?;
        } else if kind.is_file() {
            fs::copy(entry.path(), &to)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_tree_skips_links_and_replace_dir_swaps() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("review/scripts")).unwrap();
        fs::write(src.join("review/SKILL.md"), b"skill").unwrap();
        fs::write(src.join("review/scripts/run.sh"), b"#!/bin/sh").unwrap();
        fs::set_permissions(
            src.join("review/scripts/run.sh"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        fs::write(dir.path().join("secret"), b"cnry").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), src.join("review/leak")).unwrap();
        std::os::unix::fs::symlink(dir.path(), src.join("up")).unwrap();

        let target = dir.path().join("skills");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("old.md"), b"old").unwrap();
        let staged = staging_path(&target).unwrap();
        let copied = copy_tree(&src, &staged).unwrap();
        assert_eq!(copied.files, 2);
        assert_eq!(
            copied.skipped_links,
            [PathBuf::from("review/leak"), PathBuf::from("up")]
        );
        replace_dir(&staged, &target).unwrap();
        assert!(!target.join("old.md").exists());
        assert_eq!(fs::read(target.join("review/SKILL.md")).unwrap(), b"skill");
        let mode = fs::metadata(target.join("review/scripts/run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert!(!target.join("review/leak").exists());
        // Nothing is left beside the target but the source and the secret.
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["secret", "skills", "src"]);
    }

    #[test]
    fn kinds_and_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"").unwrap();
        std::os::unix::fs::symlink(&file, dir.path().join("l")).unwrap();
        assert_eq!(kind(&file).unwrap(), Kind::File);
        assert_eq!(kind(dir.path()).unwrap(), Kind::Dir);
        assert_eq!(kind(&dir.path().join("l")).unwrap(), Kind::Link);
        assert_eq!(kind(&dir.path().join("none")).unwrap(), Kind::Missing);
        fs::write(dir.path().join(format!("{TEMP_PREFIX}1.0")), b"half").unwrap();
        fs::create_dir(dir.path().join(format!("{TEMP_PREFIX}1.1"))).unwrap();
        assert_eq!(remove_leftovers(dir.path()).unwrap(), 2);
        assert!(file.exists());
    }
}
