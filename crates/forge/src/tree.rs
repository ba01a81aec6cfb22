//! The files a finished job left in its work tree, read as data: what a `fix` job publishes.
//!
//! The work tree is the job's, so everything in it is hostile: its `.git` (configured filters,
//! hooks, a `core.fsmonitor`), gitfiles naming other repositories, FIFOs, links out of the tree,
//! sparse files of a terabyte. Nothing here runs git on it, follows a link in it or waits on it:
//! the tree is walked by descriptor, never through a link ([`walk`]), each file is opened beneath
//! the tree with no link resolved on the way and checked to be a regular file, and every file
//! counts against the limits the operator set before a byte of it is read. What is not a file, a
//! folder or a link that stays inside the tree, and any `.git` below the top, is refused rather
//! than skipped, so that nothing a job leaves goes missing from its pull request unnoticed.
//!
//! Which files count follows `git add -A` on the base's index: files the base tracks always,
//! other files unless `.gitignore` (or the top's `.git/info/exclude`) ignores them. What git
//! would do besides, and this does not: clean filters and end-of-line conversion from
//! `.gitattributes` (the bytes are published as the job left them), and submodules (refused).

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

/// How much of a job's tree is published, at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest file, in bytes (its size, whatever of it is sparse).
    pub file_bytes: u64,
    /// All files together.
    pub total_bytes: u64,
    /// Files, links and folders.
    pub entries: usize,
    /// The walk and the read together.
    pub time: Duration,
}

/// Which limit a tree went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    FileBytes(u64),
    TotalBytes(u64),
    Entries(usize),
    Time(Duration),
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Limit::FileBytes(n) => write!(f, "a file may hold at most {n} bytes"),
            Limit::TotalBytes(n) => write!(f, "its files may hold at most {n} bytes together"),
            Limit::Entries(n) => write!(f, "it may hold at most {n} files, links and folders"),
            Limit::Time(d) => write!(f, "it must be read within {} seconds", d.as_secs()),
        }
    }
}

/// Why a tree is not published. A path is the job's own text, shown with its control characters
/// escaped and cut to a length a record holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("{path} is {why}, which pi-dispatch does not publish")]
    Refused { path: String, why: &'static str },
    #[error("the job's tree is too large to publish: {limit}{}", at(.path))]
    TooLarge { path: Option<String>, limit: Limit },
    /// A file, a link or a path holds a value the job was given ([`crate::scan`]).
    #[error("{path} holds the value of {variable} ({form}), which pi-dispatch never publishes")]
    Secret {
        path: String,
        variable: String,
        form: &'static str,
    },
    #[error("{path} cannot be read ({kind})")]
    Unreadable {
        path: String,
        kind: std::io::ErrorKind,
    },
}

fn at(path: &Option<String>) -> String {
    path.as_ref()
        .map(|p| format!(" ({p} is past it)"))
        .unwrap_or_default()
}

/// A path as a record may show it: control characters escaped, at most 200 characters.
pub fn shown(path: &[u8]) -> String {
    let text = String::from_utf8_lossy(path);
    let mut out = String::new();
    for c in text.chars() {
        if out.chars().count() >= 200 {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// What a published path is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A regular file of `size` bytes, executable by its owner or not.
    File { exec: bool, size: u64 },
    /// A symbolic link, by its target (which stays inside the tree).
    Link { target: Vec<u8> },
}

/// One path of the tree, relative to its top, its parts joined by `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub path: Vec<u8>,
    pub kind: Kind,
}

/// Git's own folder, and names git reads as it (any case).
fn is_dot_git(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b".git")
}

/// Whether `target`, a link's target in folder `dir` (its parts from the top), stays inside the
/// tree: a relative path that never climbs above the top. Pure.
pub fn stays_inside(dir: &[&[u8]], target: &[u8]) -> bool {
    if target.is_empty() || target.starts_with(b"/") {
        return false;
    }
    let mut depth = dir.len();
    for part in target.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            _ => depth += 1,
        }
    }
    true
}

/// The paths the base tracks, and every folder that holds one: those are published (or walked)
/// even where `.gitignore` ignores them, as `git add -A` keeps what its index has.
#[derive(Debug, Default)]
pub struct Tracked {
    files: HashSet<Vec<u8>>,
    folders: HashSet<Vec<u8>>,
}

impl Tracked {
    /// From `git ls-tree -r -z --name-only` output. Pure.
    pub fn from_ls_tree(output: &[u8]) -> Tracked {
        let mut t = Tracked::default();
        for path in output.split(|b| *b == 0).filter(|p| !p.is_empty()) {
            let mut end = path.len();
            while let Some(slash) = path[..end].iter().rposition(|b| *b == b'/') {
                t.folders.insert(path[..slash].to_vec());
                end = slash;
            }
            t.files.insert(path.to_vec());
        }
        t
    }
}

/// The `.gitignore` matchers that apply in a folder, shallowest first.
#[derive(Clone, Default)]
struct Ignores(Vec<Gitignore>);

impl Ignores {
    /// Whether `path` (from the top) is ignored: the deepest matcher with an opinion decides.
    fn ignored(&self, path: &[u8], is_dir: bool) -> bool {
        let full = virtual_path(path);
        for gi in self.0.iter().rev() {
            match gi.matched(&full, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        false
    }
}

/// Where a path from the top is, for a matcher rooted at `/` + its folder.
fn virtual_path(path: &[u8]) -> PathBuf {
    let mut full = b"/".to_vec();
    full.extend_from_slice(path);
    PathBuf::from(OsStr::from_bytes(&full))
}

/// The patterns of an ignore file's text, rooted at `folder` (from the top).
fn matcher(folder: &[u8], text: &[u8]) -> Gitignore {
    let mut builder = GitignoreBuilder::new(virtual_path(folder));
    for line in String::from_utf8_lossy(text).lines() {
        // A pattern git would not take either is left out, as git leaves it out.
        let _ = builder.add_line(None, line);
    }
    builder.build().unwrap_or_else(|_| Gitignore::empty())
}

/// The longest ignore file read.
const MAX_IGNORE_FILE: u64 = 1 << 20;

struct Walk<'a> {
    tracked: &'a Tracked,
    limits: &'a Limits,
    deadline: Instant,
    items: Vec<Item>,
    entries: usize,
    total: u64,
}

/// Every path of the tree at `top` that a `fix` job publishes, checked against `limits`. The
/// top's `.git` is neither read nor published (but its `info/exclude`, as patterns).
pub fn walk(top: &Path, tracked: &Tracked, limits: &Limits) -> Result<Vec<Item>, TreeError> {
    let root = open_dir(rustix::fs::CWD, top).map_err(|kind| TreeError::Unreadable {
        path: "the work tree".to_owned(),
        kind,
    })?;
    let mut walk = Walk {
        tracked,
        limits,
        deadline: Instant::now() + limits.time,
        items: Vec::new(),
        entries: 0,
        total: 0,
    };
    let mut ignores = Ignores::default();
    if let Ok(text) = read_small(&root, b".git/info/exclude") {
        ignores.0.push(matcher(b"", &text));
    }
    walk.folder(&root, &[], ignores)?;
    walk.items.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(walk.items)
}

fn open_dir(at: impl AsFd, path: impl rustix::path::Arg) -> Result<OwnedFd, std::io::ErrorKind> {
    rustix::fs::openat(
        at,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| std::io::Error::from(e).kind())
}

/// Opens `path` (from the top) beneath `top` with no link followed on the way and no wait on a
/// special file, and checks that it is a regular file: its descriptor and size.
pub fn open_file(top: &OwnedFd, path: &[u8]) -> Result<(OwnedFd, u64), std::io::ErrorKind> {
    let fd = rustix::fs::openat2(
        top,
        OsStr::from_bytes(path),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| std::io::Error::from(e).kind())?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| std::io::Error::from(e).kind())?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(std::io::ErrorKind::InvalidInput);
    }
    Ok((fd, u64::try_from(stat.st_size).unwrap_or(0)))
}

/// An ignore file's text, when it is a regular file of at most [`MAX_IGNORE_FILE`] bytes.
fn read_small(top: &OwnedFd, path: &[u8]) -> Result<Vec<u8>, std::io::ErrorKind> {
    use std::io::Read as _;
    let (fd, size) = open_file(top, path)?;
    if size > MAX_IGNORE_FILE {
        return Err(std::io::ErrorKind::FileTooLarge);
    }
    let mut text = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_IGNORE_FILE)
        .read_to_end(&mut text)
        .map_err(|e| e.kind())?;
    Ok(text)
}

impl Walk<'_> {
    fn count(&mut self, path: &[u8]) -> Result<(), TreeError> {
        self.entries += 1;
        if self.entries > self.limits.entries {
            return Err(TreeError::TooLarge {
                path: Some(shown(path)),
                limit: Limit::Entries(self.limits.entries),
            });
        }
        if Instant::now() > self.deadline {
            return Err(TreeError::TooLarge {
                path: None,
                limit: Limit::Time(self.limits.time),
            });
        }
        Ok(())
    }

    fn folder(&mut self, dir: &OwnedFd, parts: &[&[u8]], parent: Ignores) -> Result<(), TreeError> {
        let here = parts.join(&b'/');
        let mut ignores = parent;
        let top = parts.is_empty();
        // This folder's own patterns, read as data beneath it.
        if let Ok(text) = read_small(dir, b".gitignore") {
            ignores.0.push(matcher(&here, &text));
        }
        let names = sorted_names(dir).map_err(|kind| TreeError::Unreadable {
            path: if here.is_empty() {
                "the work tree".to_owned()
            } else {
                shown(&here)
            },
            kind,
        })?;
        for name in names {
            let mut path = here.clone();
            if !top {
                path.push(b'/');
            }
            path.extend_from_slice(&name);
            if is_dot_git(&name) {
                if top && name == b".git" {
                    continue;
                }
                return Err(TreeError::Refused {
                    path: shown(&path),
                    why: "a git folder or gitfile below the top (a nested repository)",
                });
            }
            self.count(&path)?;
            self.entry(dir, parts, &name, path, &ignores)?;
        }
        Ok(())
    }

    /// One entry of the folder `dir` (at `parts`), at `path` from the top: walked into, kept, left
    /// out as ignored, or refused.
    fn entry(
        &mut self,
        dir: &OwnedFd,
        parts: &[&[u8]],
        name: &[u8],
        path: Vec<u8>,
        ignores: &Ignores,
    ) -> Result<(), TreeError> {
        let unreadable = |path: &[u8], kind| TreeError::Unreadable {
            path: shown(path),
            kind,
        };
        let stat = rustix::fs::statat(dir, OsStr::from_bytes(name), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| unreadable(&path, std::io::Error::from(e).kind()))?;
        let kind = FileType::from_raw_mode(stat.st_mode);
        let is_dir = kind == FileType::Directory;
        let tracked = if is_dir {
            self.tracked.folders.contains(&path)
        } else {
            self.tracked.files.contains(&path)
        };
        if !tracked && ignores.ignored(&path, is_dir) {
            return Ok(());
        }
        match kind {
            FileType::Directory => {
                let sub = open_dir(dir, OsStr::from_bytes(name))
                    .map_err(|kind| unreadable(&path, kind))?;
                let mut sub_parts = parts.to_vec();
                sub_parts.push(name);
                self.folder(&sub, &sub_parts, ignores.clone())
            }
            FileType::RegularFile => self.file(path, &stat),
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(dir, OsStr::from_bytes(name), Vec::new())
                    .map_err(|e| unreadable(&path, std::io::Error::from(e).kind()))?
                    .into_bytes();
                if !stays_inside(parts, &target) {
                    return Err(TreeError::Refused {
                        path: shown(&path),
                        why: "a link out of the repository",
                    });
                }
                self.items.push(Item {
                    path,
                    kind: Kind::Link { target },
                });
                Ok(())
            }
            FileType::Fifo => Err(refused(&path, "a FIFO")),
            FileType::Socket => Err(refused(&path, "a socket")),
            FileType::CharacterDevice | FileType::BlockDevice => Err(refused(&path, "a device")),
            FileType::Unknown => Err(refused(&path, "a file of an unknown type")),
        }
    }

    /// A regular file kept, within the limits of one file's size and the tree's.
    fn file(&mut self, path: Vec<u8>, stat: &rustix::fs::Stat) -> Result<(), TreeError> {
        let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
        if size > self.limits.file_bytes {
            return Err(TreeError::TooLarge {
                path: Some(shown(&path)),
                limit: Limit::FileBytes(self.limits.file_bytes),
            });
        }
        self.total = self.total.saturating_add(size);
        if self.total > self.limits.total_bytes {
            return Err(TreeError::TooLarge {
                path: Some(shown(&path)),
                limit: Limit::TotalBytes(self.limits.total_bytes),
            });
        }
        self.items.push(Item {
            path,
            kind: Kind::File {
                exec: stat.st_mode & 0o100 != 0,
                size,
            },
        });
        Ok(())
    }
}

/// The names in the folder `dir`, but `.` and `..`, sorted.
fn sorted_names(dir: &OwnedFd) -> Result<Vec<Vec<u8>>, std::io::ErrorKind> {
    let mut names: Vec<Vec<u8>> = Vec::new();
    let listing = rustix::fs::Dir::read_from(dir).map_err(|e| std::io::Error::from(e).kind())?;
    for entry in listing {
        let entry = entry.map_err(|e| std::io::Error::from(e).kind())?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    names.sort();
    Ok(names)
}

fn refused(path: &[u8], why: &'static str) -> TreeError {
    TreeError::Refused {
        path: shown(path),
        why,
    }
}

/// A path as `git fast-import` reads it: C-style quoted, so that any byte but NUL is safe. Pure.
pub fn quoted(path: &[u8]) -> Vec<u8> {
    let mut out = vec![b'"'];
    for &b in path {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x00..=0x1f | 0x7f => out.extend_from_slice(format!("\\{b:03o}").as_bytes()),
            _ => out.push(b),
        }
    }
    out.push(b'"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            file_bytes: 1 << 20,
            total_bytes: 4 << 20,
            entries: 1000,
            time: Duration::from_secs(60),
        }
    }

    fn paths(items: &[Item]) -> Vec<String> {
        items
            .iter()
            .map(|i| String::from_utf8_lossy(&i.path).into_owned())
            .collect()
    }

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let w = |p: &str, text: &str| {
            let path = dir.path().join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        w("README.md", "hello\n");
        w("src/lib.rs", "// lib\n");
        w(
            ".git/config",
            "[filter \"x\"]\n\tclean = touch /tmp/pwned\n",
        );
        w(".git/info/exclude", "secret.txt\n");
        w("secret.txt", "not published\n");
        w(".gitignore", "target/\n*.log\n!keep.log\n");
        w("target/debug/app", "binary");
        w("build.log", "log");
        w("keep.log", "kept");
        w("dist/app.js", "tracked though ignored");
        w("dist/.gitignore", "*\n");
        w("dist/new.js", "ignored");
        dir
    }

    #[test]
    fn files_follow_gitignore_and_what_the_base_tracks() {
        let dir = tree();
        let tracked = Tracked::from_ls_tree(b"README.md\0dist/app.js\0");
        let items = walk(dir.path(), &tracked, &limits()).unwrap();
        assert_eq!(
            paths(&items),
            [
                ".gitignore",
                "README.md",
                "dist/app.js",
                "keep.log",
                "src/lib.rs"
            ]
        );
        assert_eq!(
            items[1].kind,
            Kind::File {
                exec: false,
                size: 6
            }
        );
    }

    #[test]
    fn links_stay_inside_or_are_refused() {
        assert!(stays_inside(&[], b"README.md"));
        assert!(stays_inside(&[b"a", b"b"], b"../../c"));
        assert!(stays_inside(&[b"a"], b"./x/../y"));
        assert!(!stays_inside(&[b"a"], b"../../etc/passwd"));
        assert!(!stays_inside(&[], b"/etc/passwd"));
        assert!(!stays_inside(&[], b""));
        let dir = tree();
        std::os::unix::fs::symlink("src/lib.rs", dir.path().join("lib")).unwrap();
        let items = walk(dir.path(), &Tracked::default(), &limits()).unwrap();
        let link = items.iter().find(|i| i.path == b"lib").unwrap();
        assert_eq!(
            link.kind,
            Kind::Link {
                target: b"src/lib.rs".to_vec()
            }
        );
        std::os::unix::fs::symlink("/root/.ssh/id_rsa", dir.path().join("src/key")).unwrap();
        let err = walk(dir.path(), &Tracked::default(), &limits()).unwrap_err();
        assert!(
            matches!(&err, TreeError::Refused { path, .. } if path == "src/key"),
            "{err}"
        );
    }

    #[test]
    fn special_files_and_nested_repositories_are_refused() {
        let dir = tree();
        let fifo = dir.path().join("src/pipe");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let err = walk(dir.path(), &Tracked::default(), &limits()).unwrap_err();
        assert_eq!(
            err,
            TreeError::Refused {
                path: "src/pipe".into(),
                why: "a FIFO"
            }
        );
        std::fs::remove_file(&fifo).unwrap();
        // A gitfile naming another repository, and a nested git folder (any case).
        for name in ["sub/.git", "sub/.GIT"] {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, "gitdir: ../x\n").unwrap();
            let err = walk(dir.path(), &Tracked::default(), &limits()).unwrap_err();
            assert!(
                matches!(&err, TreeError::Refused { path, .. } if path == name),
                "{err}"
            );
            std::fs::remove_file(&path).unwrap();
        }
        // An ignored FIFO is never looked at, as git would not.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.path().join("target/pipe"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        assert!(walk(dir.path(), &Tracked::default(), &limits()).is_ok());
    }

    #[test]
    fn a_sparse_file_counts_its_size_before_a_byte_is_read() {
        let dir = tree();
        let file = std::fs::File::create(dir.path().join("huge.bin")).unwrap();
        file.set_len(1 << 40).unwrap();
        let err = walk(dir.path(), &Tracked::default(), &limits()).unwrap_err();
        assert_eq!(
            err,
            TreeError::TooLarge {
                path: Some("huge.bin".into()),
                limit: Limit::FileBytes(1 << 20)
            }
        );
        file.set_len(900 << 10).unwrap();
        let small = Limits {
            total_bytes: 512 << 10,
            ..limits()
        };
        assert!(matches!(
            walk(dir.path(), &Tracked::default(), &small),
            Err(TreeError::TooLarge {
                limit: Limit::TotalBytes(_),
                ..
            })
        ));
        let few = Limits {
            entries: 3,
            ..limits()
        };
        assert!(matches!(
            walk(dir.path(), &Tracked::default(), &few),
            Err(TreeError::TooLarge {
                limit: Limit::Entries(3),
                ..
            })
        ));
    }

    #[test]
    fn paths_are_quoted_for_fast_import_and_shown_escaped() {
        assert_eq!(quoted(b"a b/c"), b"\"a b/c\"");
        assert_eq!(quoted(b"q\"\\\n"), b"\"q\\\"\\\\\\012\"");
        assert_eq!(shown(b"x\x1b]0;t\x07"), "x\\u{1b}]0;t\\u{7}");
        assert_eq!(shown(&[b'a'; 300]).chars().count(), 201);
    }
}
