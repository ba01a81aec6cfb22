#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `run.secrets` resolved by real resolver scripts in a deployment folder.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use sandbox::secrets::{Fault, Resolver, SecretError, Unusable};
use tempfile::TempDir;

const CANARY: &str = "cnry-resolver-5c1e";

/// A deployment folder whose profile `ci` resolver is `script` (a shell script body).
fn deployment(script: &str) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("resolvers")).unwrap();
    write_resolver(dir.path(), "ci", script, 0o755);
    dir
}

fn write_resolver(dir: &Path, profile: &str, script: &str, mode: u32) {
    let path = dir.join("resolvers").join(profile);
    std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn secrets(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, r)| ((*n).to_owned(), (*r).to_owned()))
        .collect()
}

/// Neither the error's message nor its `Debug` shows the canary.
fn assert_clean(e: &SecretError) {
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains(CANARY), "{shown}");
}

fn command_lines_with(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

#[tokio::test]
async fn exit_zero_gives_the_value_run_as_the_contract_says() {
    // The reference as the only argument, in the deployment folder, standard input closed, the
    // worker's environment; one trailing newline removed.
    let d = deployment(
        r#"printf '%s|%s|%s|%s|%s\n\n' "$1" "$#" "$(pwd)" "$(cat)" "${PATH:+has-path}""#,
    );
    let r = Resolver::find(d.path(), "ci").unwrap();
    let value = r.resolve("DOCS_TOKEN", "op://ci/docs/token").await.unwrap();
    let here = d.path().canonicalize().unwrap();
    assert_eq!(
        value.expose(),
        format!("op://ci/docs/token|1|{}||has-path\n", here.display())
    );
}

#[tokio::test]
async fn every_secret_is_resolved_each_reference_once() {
    let d = deployment(r#"echo call >> calls; echo "v-$1""#);
    let r = Resolver::find(d.path(), "ci").unwrap();
    let got = r
        .resolve_all(&secrets(&[
            ("A_TOKEN", "ref-a"),
            ("B_TOKEN", "ref-b"),
            ("C_TOKEN", "ref-a"),
        ]))
        .await
        .unwrap();
    let got: Vec<(&str, &str)> = got.iter().map(|(n, v)| (n.as_str(), v.expose())).collect();
    assert_eq!(
        got,
        [
            ("A_TOKEN", "v-ref-a"),
            ("B_TOKEN", "v-ref-b"),
            ("C_TOKEN", "v-ref-a")
        ]
    );
    let calls = std::fs::read_to_string(d.path().join("calls")).unwrap();
    assert_eq!(calls.lines().count(), 2);
}

#[tokio::test]
async fn exit_two_refuses_naming_the_secret_never_the_output() {
    let d = deployment(&format!(
        r#"echo "{CANARY} out"; echo "{CANARY} err" >&2; exit 2"#
    ));
    let r = Resolver::find(d.path(), "ci").unwrap();
    let e = r
        .resolve_all(&secrets(&[("DOCS_TOKEN", "op://x")]))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        SecretError::Unresolved {
            name: "DOCS_TOKEN".into(),
            profile: "ci".into(),
            why: Unusable::Declined
        }
    );
    assert_eq!(
        (e.reason().as_str(), e.code(), e.is_retry()),
        ("secret-unresolved", 2, false)
    );
    assert!(e.to_string().contains("DOCS_TOKEN"));
    assert_clean(&e);
}

#[tokio::test]
async fn another_exit_is_retried_never_showing_the_output() {
    let d = deployment(&format!(
        r#"echo "{CANARY} out"; echo "{CANARY} err" >&2; exit 1"#
    ));
    let e = Resolver::find(d.path(), "ci")
        .unwrap()
        .resolve("DOCS_TOKEN", "op://x")
        .await
        .unwrap_err();
    assert_eq!(
        e,
        SecretError::ResolverFailed {
            name: "DOCS_TOKEN".into(),
            profile: "ci".into(),
            fault: Fault::Exit(1)
        }
    );
    assert_eq!(
        (e.reason().as_str(), e.code(), e.is_retry()),
        ("secret-resolver-failed", 1, true)
    );
    assert_clean(&e);

    let d = deployment(&format!("echo {CANARY}; kill -9 $$"));
    let e = Resolver::find(d.path(), "ci")
        .unwrap()
        .resolve("DOCS_TOKEN", "op://x")
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            SecretError::ResolverFailed {
                fault: Fault::Signal(9),
                ..
            }
        ),
        "{e:?}"
    );
    assert_clean(&e);
}

#[tokio::test]
async fn the_time_limit_is_a_retry_and_ends_what_the_resolver_started() {
    let reference = format!("ref-{}-timeout", std::process::id());
    let d = deployment(&format!(
        r#"echo {CANARY}; sh -c 'sleep 1000' "$1" & sleep 1000"#
    ));
    let r = Resolver::find(d.path(), "ci")
        .unwrap()
        .with_limit(Duration::from_millis(500));
    let started = Instant::now();
    let e = r.resolve("DOCS_TOKEN", &reference).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(
            e,
            SecretError::ResolverFailed {
                fault: Fault::TimedOut,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.is_retry());
    assert_clean(&e);
    // Its background child (which names the reference) is gone with it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !command_lines_with(&reference).is_empty() {
        assert!(Instant::now() < deadline, "the resolver's child survived");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn a_value_is_taken_when_the_resolver_exits_though_a_child_holds_its_output() {
    let reference = format!("ref-{}-child", std::process::id());
    let d = deployment(r#"sh -c 'sleep 1000' "$1" & echo value"#);
    let r = Resolver::find(d.path(), "ci")
        .unwrap()
        .with_limit(Duration::from_secs(10));
    let started = Instant::now();
    let value = r.resolve("DOCS_TOKEN", &reference).await.unwrap();
    assert_eq!(value.expose(), "value");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(command_lines_with(&reference), Vec::<u32>::new());
}

#[tokio::test]
async fn unusable_output_refuses() {
    for (script, why) in [
        ("echo", Unusable::Empty),
        ("true", Unusable::Empty),
        ("head -c 70000 /dev/zero | tr '\\0' a", Unusable::TooLarge),
        // Far more than a pipe holds: the resolver is stopped, not waited for.
        ("yes", Unusable::TooLarge),
        (&*format!("printf '{CANARY}\\000x'"), Unusable::NotText),
        ("printf '\\377\\376'", Unusable::NotText),
    ] {
        let d = deployment(script);
        let e = Resolver::find(d.path(), "ci")
            .unwrap()
            .with_limit(Duration::from_secs(20))
            .resolve("DOCS_TOKEN", "op://x")
            .await
            .unwrap_err();
        assert_eq!(
            e,
            SecretError::Unresolved {
                name: "DOCS_TOKEN".into(),
                profile: "ci".into(),
                why
            },
            "{script}"
        );
        assert_clean(&e);
    }
}

#[tokio::test]
async fn a_missing_or_unusable_resolver_refuses() {
    let d = deployment("echo value");
    let missing = Resolver::find(d.path(), "other").unwrap_err();
    assert_eq!(
        missing,
        SecretError::ResolverMissing {
            profile: "other".into()
        }
    );
    assert_eq!(
        (missing.reason().as_str(), missing.code()),
        ("secret-resolver-missing", 2)
    );

    write_resolver(d.path(), "plain", "echo value", 0o644);
    assert!(matches!(
        Resolver::find(d.path(), "plain"),
        Err(SecretError::ResolverMissing { .. })
    ));
    std::fs::create_dir(d.path().join("resolvers/folder")).unwrap();
    assert!(matches!(
        Resolver::find(d.path(), "folder"),
        Err(SecretError::ResolverMissing { .. })
    ));
    // A name that is not a profile's never becomes a path.
    assert!(matches!(
        Resolver::find(d.path(), "../resolvers/ci"),
        Err(SecretError::ResolverMissing { .. })
    ));
    // An interpreter that is not there: the resolver cannot start, which no retry mends.
    let path = d.path().join("resolvers/broken");
    std::fs::write(&path, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = Resolver::find(d.path(), "broken")
        .unwrap()
        .resolve("DOCS_TOKEN", "op://x")
        .await
        .unwrap_err();
    assert_eq!(
        e,
        SecretError::ResolverMissing {
            profile: "broken".into()
        }
    );
}
