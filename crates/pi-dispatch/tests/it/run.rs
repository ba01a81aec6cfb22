//! `run FOLDER --task TEXT`: the repository's check, as its owner, when the folder sits under one
//! that owner cannot enter (the deployment here is a 0700 folder of root's), and what it says when
//! the owner cannot use the folder itself.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use crate::common::{Deployment, Run, git};

const NOBODY: u32 = 65534;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A deployment in a 0700 folder of root's, and a committed repository in it owned by nobody.
fn closed_deployment() -> (Deployment, PathBuf) {
    let d = Deployment::new();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let meta = std::fs::metadata(d.path()).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o700));
    assert_eq!(d.run(&["init"]).code, 0);
    let repo = d.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("README.md"), "a repository\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "init"]);
    let chown = std::process::Command::new("chown")
        .args(["-R", &format!("{NOBODY}:{NOBODY}")])
        .arg(&repo)
        .status()
        .unwrap();
    assert!(chown.success());
    (d, repo.canonicalize().unwrap())
}

fn run(d: &Deployment, repo: &Path) -> Run {
    d.run(&["run", repo.to_str().unwrap(), "--task", "Write NOTES.md"])
}

#[test]
fn a_clean_repository_under_a_folder_its_owner_cannot_enter_is_queued() {
    if !is_root() {
        eprintln!("skipped: only root runs git as the folder's owner");
        return;
    }
    let (d, repo) = closed_deployment();
    // A job the worker could run: its image, a model and the model's key are there.
    d.install_image(&[]);
    d.write(
        "pi-global/models.json",
        r#"{"providers": {"demo": {"baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions",
            "apiKey": "$DEMO_MODEL_KEY", "models": [{"id": "scripted"}]}}}"#,
    );
    d.write(".env", "PI_EGRESS=0\nPI_PROVIDER=demo\nPI_MODEL=scripted\n");
    let out = Run::from(
        d.command(&["run", repo.to_str().unwrap(), "--task", "Write NOTES.md"])
            .env("DEMO_MODEL_KEY", "demo-key")
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("Queued cli-"), "{}", out.stdout);
}

#[test]
fn a_dirty_repository_there_is_refused_as_dirty() {
    if !is_root() {
        eprintln!("skipped: only root runs git as the folder's owner");
        return;
    }
    let (d, repo) = closed_deployment();
    std::fs::write(repo.join("draft.txt"), "not committed\n").unwrap();
    let out = run(&d, &repo);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(
        out.stderr,
        format!(
            "pi-dispatch: {} has uncommitted changes, and the job would work among them; commit or stash them, or pass --force\n",
            repo.display()
        )
    );
    assert!(!out.stdout.contains("Queued"), "{}", out.stdout);
}

#[test]
fn a_folder_its_owner_cannot_write_is_named_with_the_user() {
    if !is_root() {
        eprintln!("skipped: only root runs git as the folder's owner");
        return;
    }
    let (d, repo) = closed_deployment();
    std::fs::set_permissions(&repo, std::fs::Permissions::from_mode(0o555)).unwrap();
    let out = run(&d, &repo);
    assert_ne!(out.code, 0);
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let name = if passwd.lines().any(|l| l.starts_with("nobody:x:65534:")) {
        "nobody "
    } else {
        ""
    };
    assert!(
        out.stderr.contains(&format!(
            "the job's user {name}(uid 65534) cannot write {} (mode 0555, owner uid 65534, group gid 65534)",
            repo.display()
        )),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("FOLDER"), "{}", out.stderr);
}

#[test]
fn a_folder_that_is_no_repository_is_named_by_its_path() {
    if !is_root() {
        eprintln!("skipped: only root runs git as the folder's owner");
        return;
    }
    let (d, repo) = closed_deployment();
    std::fs::remove_dir_all(repo.join(".git")).unwrap();
    let out = run(&d, &repo);
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains(&format!(
            "{} is not a git work tree that git can read (fatal: not a git repository",
            repo.display()
        )),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("FOLDER"), "{}", out.stderr);
}

/// A repository a job left with a clean filter in its `.git/config`, named by its `.gitattributes`,
/// and README.md touched so that git must read it again through the filter.
fn planted(filter: &str) -> (Deployment, PathBuf) {
    let (d, repo) = closed_deployment();
    let give = |owner: u32| {
        let chown = std::process::Command::new("chown")
            .args(["-R", &format!("{owner}:{owner}")])
            .arg(&repo)
            .status()
            .unwrap();
        assert!(chown.success());
    };
    give(0);
    std::fs::write(repo.join(".gitattributes"), "* filter=x\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "attributes"]);
    let mut config = std::fs::read_to_string(repo.join(".git/config")).unwrap();
    // Quoted: a `;` would start a comment in a config value.
    config.push_str(&format!("[filter \"x\"]\n\tclean = \"{filter}\"\n"));
    std::fs::write(repo.join(".git/config"), config).unwrap();
    give(NOBODY);
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(repo.join("README.md"), "a repository\n").unwrap();
    (d, repo)
}

/// The filter runs only in the check's sandbox: it changes what git sees (so the repository reads
/// as changed: the probe ran), and it reaches no other process of its user: another process of the
/// folder's owner runs meanwhile, holding a canary, and the filter tries to copy every process's
/// environment into a folder every user may write, through each process's own view of the host's
/// root and directly. Nothing arrives.
#[test]
fn a_filter_a_job_planted_runs_only_in_the_checks_sandbox() {
    if !is_root() {
        eprintln!("skipped: only root runs git as the folder's owner");
        return;
    }
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = open.path().join("planted");
    let mut owners = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["env", "OWNERS_SECRET=cnry-owner-7c1", "sleep", "60"])
        .spawn()
        .unwrap();
    let filter = format!(
        "sh -c 'for p in /proc/[0-9]*; do cat $p/environ >> $p/root{m}; done; id >> {m}; printf changed'",
        m = marker.display()
    );
    let (d, repo) = planted(&filter);
    let out = run(&d, &repo);
    let _ = owners.kill();
    let _ = owners.wait();
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("has uncommitted changes"),
        "the filter ran and changed what git read: {}",
        out.stderr
    );
    assert!(
        !marker.exists(),
        "the job's filter wrote on the host: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
}

/// A filter that never ends holds `run` up only until the check's limit; nothing of it is left.
#[test]
fn a_filter_that_never_ends_is_stopped_at_the_checks_limit() {
    if !is_root() {
        eprintln!("skipped: only root runs git as the folder's owner");
        return;
    }
    let (d, repo) = planted("sleep 7391");
    d.write(".env", "PI_RUN_CHECK_TIME_LIMIT=2\n");
    let started = std::time::Instant::now();
    let out = run(&d, &repo);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "git could not check {} for uncommitted changes: it ran longer than 2 seconds and was stopped",
            repo.display()
        )),
        "{}",
        out.stderr
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let left = crate::common::processes_with("sleep 7391", 0);
    assert!(left.is_empty(), "{left:?}");
}
