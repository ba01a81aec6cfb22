//! The job's repository: cloned before the job, and its changes published after it.
//!
//! The worker fetches the event's ref into a bare repository of its own (`origin.git`, in the job's
//! state folder, which the job never sees), then clones the job's workspace from it, points the
//! workspace's `origin` at the forge (no credential in it) and hands it to the job's user. After a
//! `fix` job, it reads the workspace's files (not its `.git`, which the job could have rewritten:
//! hooks, `url.*.insteadOf`, proxies) into a commit on the base, with its own index, and pushes that
//! commit from `origin.git`.
//!
//! Every git runs with an environment of its own: no system or global configuration, no prompt,
//! no redirect followed, http(s) and file only; the token rides in `http.extraHeader`, set through
//! `GIT_CONFIG_*` variables, so it is never in a URL, an argument or a config file.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::tree::{self, Kind, Limits, Tracked, TreeError};

/// The branch of `origin.git` holding the base the job starts from.
pub const BASE_BRANCH: &str = "pi-dispatch-base";

/// Why git failed: the step and its exit status (git's own output may hold anything a remote
/// said, so it is not kept).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GitError {
    #[error("git could not {op} ({why})")]
    Failed { op: &'static str, why: String },
    /// What the job left is not published (see [`crate::tree`]).
    #[error(transparent)]
    Tree(#[from] TreeError),
}

fn failed(op: &'static str, why: impl Into<String>) -> GitError {
    GitError::Failed {
        op,
        why: why.into(),
    }
}

/// A job's clone.
#[derive(Debug, Clone)]
pub struct Checkout {
    /// The worker's bare repository.
    pub origin: PathBuf,
    /// The job's work tree.
    pub workspace: PathBuf,
}

/// Who authors the worker's commits.
#[derive(Debug, Clone)]
pub struct Author {
    pub name: String,
    pub email: String,
}

struct Git<'a> {
    home: &'a Path,
    authorization: Option<&'a str>,
}

impl<'a> Git<'a> {
    /// git with `home` as its only configuration: without the forge's header, and with it.
    fn pair(home: &'a Path, authorization: &'a str) -> (Git<'a>, Git<'a>) {
        let plain = Git {
            home,
            authorization: None,
        };
        let authed = Git {
            home,
            authorization: Some(authorization),
        };
        (plain, authed)
    }

    fn command(&self, args: &[&std::ffi::OsStr]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::from(self.std_command(args));
        cmd.kill_on_drop(true);
        cmd
    }

    fn std_command(&self, args: &[&std::ffi::OsStr]) -> std::process::Command {
        let mut cmd = std::process::Command::new("git");
        cmd.args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.home)
            .env("LC_ALL", "C")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_ASKPASS", "/bin/false")
            .env("SSH_ASKPASS", "/bin/false")
            .env("GIT_ALLOW_PROTOCOL", "http:https:file")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut config: Vec<(&str, String)> = vec![("http.followRedirects", "false".to_owned())];
        if let Some(auth) = self.authorization {
            config.push(("http.extraHeader", format!("Authorization: {auth}")));
        }
        cmd.env("GIT_CONFIG_COUNT", config.len().to_string());
        for (n, (key, value)) in config.iter().enumerate() {
            cmd.env(format!("GIT_CONFIG_KEY_{n}"), key)
                .env(format!("GIT_CONFIG_VALUE_{n}"), value);
        }
        cmd
    }

    async fn run(
        &self,
        op: &'static str,
        args: &[&std::ffi::OsStr],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Result<String, GitError> {
        let mut cmd = self.command(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd
            .output()
            .await
            .map_err(|e| failed(op, format!("git cannot be started: {}", e.kind())))?;
        if !out.status.success() {
            return Err(failed(
                op,
                match out.status.code() {
                    Some(c) => format!("it exited with status {c}"),
                    None => "it was killed".to_owned(),
                },
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// `git rev-parse REV` in the bare repository `origin`.
    async fn rev_parse(
        &self,
        origin: &Path,
        op: &'static str,
        rev: &str,
    ) -> Result<String, GitError> {
        self.run(
            op,
            &[
                os("--git-dir"),
                origin.as_os_str(),
                os("rev-parse"),
                os(rev),
            ],
            &[],
        )
        .await
    }

    /// The base's files in the bare repository `origin`, as `git ls-tree -r -z --name-only` lists
    /// them (not trimmed: a name may end in white space).
    async fn base_files(&self, origin: &Path) -> Result<Vec<u8>, GitError> {
        let out = self
            .command(&[
                os("--git-dir"),
                origin.as_os_str(),
                os("ls-tree"),
                os("-r"),
                os("-z"),
                os("--name-only"),
                os(BASE_BRANCH),
            ])
            .output()
            .await
            .map_err(|e| failed("list the base's files", e.kind().to_string()))?;
        if !out.status.success() {
            return Err(failed("list the base's files", "git failed"));
        }
        Ok(out.stdout)
    }
}

/// `git -C workspace` and the rest of the arguments.
fn in_work_tree<'a>(workspace: &'a Path, rest: &[&'a str]) -> Vec<&'a std::ffi::OsStr> {
    [os("-C"), workspace.as_os_str()]
        .into_iter()
        .chain(rest.iter().map(|s| os(s)))
        .collect()
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

/// Clones `source_ref` (a branch, or a ref such as `refs/pull/7/head`) of `url` into
/// `dir/workspace`, on a new branch `work_branch`, owned by `owner` (uid, gid). What an earlier
/// attempt left in `dir` is replaced.
pub async fn clone(
    dir: &Path,
    url: &str,
    source_ref: &str,
    authorization: &str,
    work_branch: &str,
    owner: (u32, u32),
) -> Result<Checkout, GitError> {
    let origin = dir.join("origin.git");
    let workspace = dir.join("workspace");
    let home = dir.join("git-home");
    for old in [&origin, &workspace, &home] {
        if old.symlink_metadata().is_ok() {
            std::fs::remove_dir_all(old)
                .map_err(|e| failed("clear an earlier attempt's clone", e.kind().to_string()))?;
        }
    }
    std::fs::create_dir_all(&home).map_err(|e| failed("make its home", e.kind().to_string()))?;
    let (plain, authed) = Git::pair(&home, authorization);
    fetch_base(&plain, &authed, &origin, url, source_ref).await?;
    make_work_tree(&plain, &origin, &workspace, url, work_branch).await?;
    give(&workspace, owner)
        .map_err(|e| failed("give the work tree to the job's user", e.kind().to_string()))?;
    Ok(Checkout { origin, workspace })
}

/// Makes the worker's bare repository at `origin` and fetches `source_ref` of `url` into its
/// [`BASE_BRANCH`].
async fn fetch_base(
    plain: &Git<'_>,
    authed: &Git<'_>,
    origin: &Path,
    url: &str,
    source_ref: &str,
) -> Result<(), GitError> {
    plain
        .run(
            "make the worker's repository",
            &[os("init"), os("--bare"), os("-q"), origin.as_os_str()],
            &[],
        )
        .await?;
    let source = if source_ref.starts_with("refs/") {
        source_ref.to_owned()
    } else {
        format!("refs/heads/{source_ref}")
    };
    let refspec = format!("+{source}:refs/heads/{BASE_BRANCH}");
    authed
        .run(
            "fetch the repository",
            &[
                os("--git-dir"),
                origin.as_os_str(),
                os("fetch"),
                os("-q"),
                os("--no-tags"),
                os("--depth=50"),
                os(url),
                os(&refspec),
            ],
            &[],
        )
        .await?;
    Ok(())
}

/// Clones the job's work tree from `origin`, points its `origin` at the forge's `url` (no
/// credential in it), and puts it on the new branch `work_branch`.
async fn make_work_tree<'a>(
    plain: &Git<'_>,
    origin: &Path,
    workspace: &'a Path,
    url: &'a str,
    work_branch: &'a str,
) -> Result<(), GitError> {
    let from = format!("file://{}", origin.display());
    plain
        .run(
            "make the job's work tree",
            &[
                os("clone"),
                os("-q"),
                os("--no-hardlinks"),
                os("--branch"),
                os(BASE_BRANCH),
                os(&from),
                workspace.as_os_str(),
            ],
            &[],
        )
        .await?;
    let in_ws = |rest: &[&'a str]| in_work_tree(workspace, rest);
    for (op, args) in [
        (
            "point the work tree at the forge",
            in_ws(&["remote", "set-url", "origin", url]),
        ),
        (
            "make the job's branch",
            in_ws(&["checkout", "-q", "-B", work_branch]),
        ),
        (
            "tidy the work tree's branches",
            in_ws(&["branch", "-q", "-D", BASE_BRANCH]),
        ),
    ] {
        plain.run(op, &args, &[]).await?;
    }
    Ok(())
}

/// Gives `path` and everything under it to `owner`, following no link.
fn give(path: &Path, (uid, gid): (u32, u32)) -> std::io::Result<()> {
    use rustix::fs::{AtFlags, CWD, Gid, Uid, chownat};
    let meta = path.symlink_metadata()?;
    chownat(
        CWD,
        path,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            give(&entry?.path(), (uid, gid))?;
        }
    }
    Ok(())
}

/// The ref `git fast-import` writes a job's commit to, in the worker's repository.
const PUBLISHED: &str = "refs/pi-dispatch/published";

/// Commits the work tree's files on the base and pushes the commit to `branch` of `url`; `None`
/// when the files are the base's (the job changed nothing).
///
/// The work tree is read as data ([`tree::walk`], within `limits`) and its files streamed into
/// `git fast-import` on the worker's own repository: no git ever runs on the job's tree or its
/// `.git`, and nothing in the tree is followed or waited on.
pub async fn publish(
    checkout: &Checkout,
    url: &str,
    authorization: &str,
    branch: &str,
    message: &str,
    author: &Author,
    bounds: Bounds<'_>,
) -> Result<Option<String>, GitError> {
    let Bounds { limits, needles } = bounds;
    let dir = checkout
        .origin
        .parent()
        .ok_or_else(|| failed("find the job's folder", "no parent"))?;
    let home = dir.join("git-home");
    let (plain, authed) = Git::pair(&home, authorization);
    let origin = checkout.origin.as_path();
    let tracked = Tracked::from_ls_tree(&plain.base_files(origin).await?);
    let base = plain
        .rev_parse(origin, "read the base", BASE_BRANCH)
        .await?;
    let stream = StreamInput {
        workspace: checkout.workspace.clone(),
        tracked,
        base,
        message: message.to_owned(),
        author: author.clone(),
        limits: *limits,
        needles: needles.clone(),
        import: plain.std_command(&[
            os("--git-dir"),
            origin.as_os_str(),
            os("fast-import"),
            os("--quiet"),
            os("--force"),
            os("--done"),
        ]),
    };
    let streamed = tokio::task::spawn_blocking(move || stream.run())
        .await
        .map_err(|_| failed("read the job's files", "the reader stopped"))?;
    streamed?;
    let tree = plain
        .rev_parse(
            origin,
            "read the job's tree",
            &format!("{PUBLISHED}^{{tree}}"),
        )
        .await?;
    let base_tree = plain
        .rev_parse(
            origin,
            "read the base's tree",
            &format!("{BASE_BRANCH}^{{tree}}"),
        )
        .await?;
    if tree == base_tree {
        return Ok(None);
    }
    let commit = plain
        .rev_parse(origin, "read the job's commit", PUBLISHED)
        .await?;
    let refspec = format!("{commit}:refs/heads/{branch}");
    let push: Vec<&std::ffi::OsStr> = vec![
        os("--git-dir"),
        origin.as_os_str(),
        os("push"),
        os("-q"),
        os(url),
        os(&refspec),
    ];
    authed.run("push the job's branch", &push, &[]).await?;
    Ok(Some(commit))
}

/// What a published tree must keep within: the operator's limits, and none of the values the job
/// was given.
#[derive(Debug, Clone, Copy)]
pub struct Bounds<'a> {
    pub limits: &'a Limits,
    pub needles: &'a crate::scan::Needles,
}

/// What the blocking half of [`publish`] needs: the tree walked and streamed into fast-import.
struct StreamInput {
    workspace: PathBuf,
    tracked: Tracked,
    base: String,
    message: String,
    author: Author,
    limits: Limits,
    /// The values the job was given: a file, link or path holding one is not published.
    needles: crate::scan::Needles,
    import: std::process::Command,
}

impl StreamInput {
    fn run(mut self) -> Result<(), GitError> {
        let started = std::time::Instant::now();
        let items = tree::walk(&self.workspace, &self.tracked, &self.limits)?;
        let top = open_tree(&self.workspace)?;
        self.import
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = self.import.spawn().map_err(|e| {
            failed(
                "store the job's files",
                format!("git cannot be started: {}", e.kind()),
            )
        })?;
        let written = child
            .stdin
            .take()
            .ok_or_else(|| failed("store the job's files", "no input"))
            .and_then(|stdin| {
                let mut out = std::io::BufWriter::with_capacity(1 << 16, stdin);
                self.write_stream(&mut out, &items, &top, started + self.limits.time)
            });
        if written.is_err() {
            let _ = child.kill();
        }
        let status = child
            .wait()
            .map_err(|e| failed("store the job's files", e.kind().to_string()))?;
        written?;
        if !status.success() {
            return Err(failed("store the job's files", "git fast-import failed"));
        }
        Ok(())
    }

    /// fast-import's whole input: a blob for each item, then the commit that names them all.
    fn write_stream(
        &self,
        out: &mut impl std::io::Write,
        items: &[tree::Item],
        top: &OwnedFd,
        deadline: std::time::Instant,
    ) -> Result<(), GitError> {
        for (n, item) in items.iter().enumerate() {
            if std::time::Instant::now() > deadline {
                return Err(TreeError::TooLarge {
                    path: None,
                    limit: tree::Limit::Time(self.limits.time),
                }
                .into());
            }
            self.write_blob(out, n + 1, item, top)?;
        }
        self.write_commit(out, items)?;
        out.write_all(b"\ndone\n").map_err(store_io)?;
        out.flush().map_err(store_io)
    }

    /// One item's blob, as mark `mark`: a link's target, or a file's bytes, none of which may hold
    /// a value the job was given.
    fn write_blob(
        &self,
        out: &mut impl std::io::Write,
        mark: usize,
        item: &tree::Item,
        top: &OwnedFd,
    ) -> Result<(), GitError> {
        holds_none(&item.path, self.needles.find(&item.path))?;
        write!(out, "blob\nmark :{mark}\n").map_err(store_io)?;
        match &item.kind {
            Kind::Link { target } => {
                holds_none(&item.path, self.needles.find(target))?;
                writeln!(out, "data {}", target.len()).map_err(store_io)?;
                out.write_all(target).map_err(store_io)?;
            }
            Kind::File { size, .. } => self.write_file_data(out, &item.path, *size, top)?,
        }
        out.write_all(b"\n").map_err(store_io)
    }

    /// A file's `data` of `size` bytes, read through `top` without following a link and searched
    /// as it goes by; a file that changed size meanwhile is unreadable.
    fn write_file_data(
        &self,
        out: &mut impl std::io::Write,
        path: &[u8],
        size: u64,
        top: &OwnedFd,
    ) -> Result<(), GitError> {
        let unreadable = |kind| TreeError::Unreadable {
            path: tree::shown(path),
            kind,
        };
        let (fd, now) = tree::open_file(top, path).map_err(unreadable)?;
        if now != size {
            return Err(unreadable(std::io::ErrorKind::InvalidData).into());
        }
        writeln!(out, "data {size}").map_err(store_io)?;
        let mut file = std::io::Read::take(std::fs::File::from(fd), size);
        // Every byte is searched as it goes by.
        let mut search = self.needles.stream();
        let mut buf = vec![0u8; 1 << 16];
        let mut copied = 0u64;
        loop {
            let n = std::io::Read::read(&mut file, &mut buf).map_err(store_io)?;
            if n == 0 {
                break;
            }
            search.feed(&buf[..n]);
            holds_none(path, search.found().cloned())?;
            out.write_all(&buf[..n]).map_err(store_io)?;
            copied += n as u64;
        }
        if copied != size {
            return Err(unreadable(std::io::ErrorKind::UnexpectedEof).into());
        }
        Ok(())
    }

    /// The commit on the base whose tree is exactly the items, by their marks.
    fn write_commit(
        &self,
        out: &mut impl std::io::Write,
        items: &[tree::Item],
    ) -> Result<(), GitError> {
        let when = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let who = format!("{} <{}> {when} +0000", self.author.name, self.author.email);
        write!(
            out,
            "commit {PUBLISHED}\nauthor {who}\ncommitter {who}\ndata {}\n{}\nfrom {}\ndeleteall\n",
            self.message.len(),
            self.message,
            self.base
        )
        .map_err(store_io)?;
        for (n, item) in items.iter().enumerate() {
            let mode = match item.kind {
                Kind::Link { .. } => "120000",
                Kind::File { exec: true, .. } => "100755",
                Kind::File { exec: false, .. } => "100644",
            };
            write!(out, "M {mode} :{} ", n + 1).map_err(store_io)?;
            out.write_all(&tree::quoted(&item.path)).map_err(store_io)?;
            out.write_all(b"\n").map_err(store_io)?;
        }
        Ok(())
    }
}

/// The job's work tree, opened without following a link.
fn open_tree(workspace: &Path) -> Result<OwnedFd, GitError> {
    rustix::fs::open(
        workspace,
        rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::DIRECTORY
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| {
        failed(
            "open the job's tree",
            std::io::Error::from(e).kind().to_string(),
        )
    })
}

/// A failed write to fast-import.
fn store_io(e: std::io::Error) -> GitError {
    failed("store the job's files", e.kind().to_string())
}

/// Refuses the item at `path` when a value the job was given was found in it.
fn holds_none(path: &[u8], found: Option<crate::scan::Found>) -> Result<(), GitError> {
    match found {
        Some(f) => Err(GitError::from(TreeError::Secret {
            path: tree::shown(path),
            variable: f.variable,
            form: f.form,
        })),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_rides_in_the_environment_never_in_an_argument() {
        let home = Path::new("/nonexistent");
        let git = Git {
            home,
            authorization: Some("Basic CANARY-token"),
        };
        let cmd = git.command(&[os("fetch"), os("http://forge.invalid/o/r.git")]);
        let cmd = cmd.as_std();
        assert!(
            cmd.get_args()
                .all(|a| !a.to_string_lossy().contains("CANARY"))
        );
        let env: Vec<(String, String)> = cmd
            .get_envs()
            .filter_map(|(k, v)| {
                Some((
                    k.to_string_lossy().into_owned(),
                    v?.to_string_lossy().into_owned(),
                ))
            })
            .collect();
        let holding: Vec<&str> = env
            .iter()
            .filter(|(_, v)| v.contains("CANARY"))
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(holding, ["GIT_CONFIG_VALUE_1"]);
        assert!(env.contains(&("GIT_CONFIG_KEY_1".to_owned(), "http.extraHeader".to_owned())));
        // No redirect is followed with it, and no configuration but this one is read.
        assert!(env.contains(&(
            "GIT_CONFIG_KEY_0".to_owned(),
            "http.followRedirects".to_owned()
        )));
        assert!(env.contains(&("GIT_CONFIG_NOSYSTEM".to_owned(), "1".to_owned())));
        assert!(env.contains(&("GIT_CONFIG_GLOBAL".to_owned(), "/dev/null".to_owned())));
    }
}
