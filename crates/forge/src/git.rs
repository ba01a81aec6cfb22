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

use std::path::{Path, PathBuf};
use std::process::Stdio;

/// The branch of `origin.git` holding the base the job starts from.
pub const BASE_BRANCH: &str = "pi-dispatch-base";

/// Why git failed: the step and its exit status (git's own output may hold anything a remote
/// said, so it is not kept).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GitError {
    #[error("git could not {op} ({why})")]
    Failed { op: &'static str, why: String },
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

impl Git<'_> {
    fn command(&self, args: &[&std::ffi::OsStr]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("git");
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
            .stderr(Stdio::piped())
            .kill_on_drop(true);
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
    let plain = Git {
        home: &home,
        authorization: None,
    };
    let authed = Git {
        home: &home,
        authorization: Some(authorization),
    };
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
    let in_ws = |rest: &[&'static str]| -> Vec<std::ffi::OsString> {
        [os("-C").to_owned(), workspace.clone().into_os_string()]
            .into_iter()
            .chain(rest.iter().map(|s| os(s).to_owned()))
            .collect()
    };
    let set_url: Vec<std::ffi::OsString> = in_ws(&["remote", "set-url", "origin"])
        .into_iter()
        .chain([os(url).to_owned()])
        .collect();
    let checkout: Vec<std::ffi::OsString> = in_ws(&["checkout", "-q", "-B"])
        .into_iter()
        .chain([os(work_branch).to_owned()])
        .collect();
    let delete = in_ws(&["branch", "-q", "-D", BASE_BRANCH]);
    for (op, args) in [
        ("point the work tree at the forge", set_url),
        ("make the job's branch", checkout),
        ("tidy the work tree's branches", delete),
    ] {
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        plain.run(op, &args, &[]).await?;
    }
    give(&workspace, owner)
        .map_err(|e| failed("give the work tree to the job's user", e.kind().to_string()))?;
    Ok(Checkout { origin, workspace })
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

/// Commits the work tree's files on the base and pushes the commit to `branch` of `url`; `None`
/// when the files are the base's (the job changed nothing).
pub async fn publish(
    checkout: &Checkout,
    url: &str,
    authorization: &str,
    branch: &str,
    message: &str,
    author: &Author,
) -> Result<Option<String>, GitError> {
    let dir = checkout
        .origin
        .parent()
        .ok_or_else(|| failed("find the job's folder", "no parent"))?;
    let home = dir.join("git-home");
    let index = dir.join("publish.index");
    let _ = std::fs::remove_file(&index);
    let plain = Git {
        home: &home,
        authorization: None,
    };
    let authed = Git {
        home: &home,
        authorization: Some(authorization),
    };
    let tree_args = |rest: &[&str]| -> Vec<std::ffi::OsString> {
        [
            os("--git-dir").to_owned(),
            checkout.origin.clone().into_os_string(),
            os("--work-tree").to_owned(),
            checkout.workspace.clone().into_os_string(),
        ]
        .into_iter()
        .chain(rest.iter().map(|s| os(s).to_owned()))
        .collect()
    };
    let env: Vec<(&str, &std::ffi::OsStr)> = vec![
        ("GIT_INDEX_FILE", index.as_os_str()),
        ("GIT_AUTHOR_NAME", os(&author.name)),
        ("GIT_AUTHOR_EMAIL", os(&author.email)),
        ("GIT_COMMITTER_NAME", os(&author.name)),
        ("GIT_COMMITTER_EMAIL", os(&author.email)),
    ];
    let run = |op: &'static str, args: Vec<std::ffi::OsString>| {
        let plain = &plain;
        let env = &env;
        async move {
            let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
            plain.run(op, &args, env).await
        }
    };
    run("read the base", tree_args(&["read-tree", BASE_BRANCH])).await?;
    run("read the job's files", tree_args(&["add", "-A", "--", "."])).await?;
    let tree = run("write the job's tree", tree_args(&["write-tree"])).await?;
    let base_tree = run(
        "read the base's tree",
        tree_args(&["rev-parse", &format!("{BASE_BRANCH}^{{tree}}")]),
    )
    .await?;
    if tree == base_tree {
        return Ok(None);
    }
    let mut commit_args = tree_args(&["commit-tree"]);
    commit_args.extend([
        os(&tree).to_owned(),
        os("-p").to_owned(),
        os(BASE_BRANCH).to_owned(),
        os("-m").to_owned(),
        os(message).to_owned(),
    ]);
    let commit = run("commit the job's files", commit_args).await?;
    let refspec = format!("{commit}:refs/heads/{branch}");
    let push: Vec<&std::ffi::OsStr> = vec![
        os("--git-dir"),
        checkout.origin.as_os_str(),
        os("push"),
        os("-q"),
        os(url),
        os(&refspec),
    ];
    authed.run("push the job's branch", &push, &env).await?;
    Ok(Some(commit))
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
