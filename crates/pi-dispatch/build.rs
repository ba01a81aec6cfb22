//! Names what `--version` says besides the crate's version: the commit this program is built from
//! (`PI_DISPATCH_COMMIT` when a package build sets it, else what `git` says of the checkout, else
//! `unknown`) and the pi the job image pins (the workspace's `package.json`).

use std::path::Path;
use std::process::Command;

/// pi's package in `package.json`'s dependencies.
const PI: &str = "@earendil-works/pi-coding-agent";

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    println!("cargo:rerun-if-env-changed=PI_DISPATCH_COMMIT");
    let commit = std::env::var("PI_DISPATCH_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git_commit(&root))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=PI_DISPATCH_COMMIT={commit}");
    let package = root.join("package.json");
    println!("cargo:rerun-if-changed={}", package.display());
    let pi = std::fs::read(&package)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .and_then(|v| v["dependencies"][PI].as_str().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=PI_DISPATCH_PI_VERSION={pi}");
}

/// The checkout's commit, short; the build runs again when it moves (HEAD, the branch it names).
fn git_commit(root: &Path) -> Option<String> {
    let git = root.join(".git");
    let head = git.join("HEAD");
    if !head.is_file() {
        return None;
    }
    println!("cargo:rerun-if-changed={}", head.display());
    if let Some(branch) = std::fs::read_to_string(&head)
        .ok()
        .and_then(|h| h.strip_prefix("ref: ").map(|r| git.join(r.trim())))
    {
        for watched in [branch, git.join("packed-refs")] {
            if watched.exists() {
                println!("cargo:rerun-if-changed={}", watched.display());
            }
        }
    }
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    let commit = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !commit.is_empty()).then_some(commit)
}
