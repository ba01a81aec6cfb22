//! A real process started the way the runner starts a stdio server sees exactly the allowed names.

// Test code fails loudly on purpose; the workspace denies unwrap only in product code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use hub::stdio::{environment, find_command};

#[test]
fn a_stdio_server_sees_exactly_the_allowed_names() {
    let runner: Vec<(String, String)> = [
        ("PATH", "/usr/bin:/bin"),
        ("HOME", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("OPENAI_API_KEY", "cnry-provider-key"),
        ("GH_TOKEN", "cnry-forge-token"),
        ("DOCS_TOKEN", "cnry-other-server"),
        ("PI_DISPATCH_CHILD_LEDGER", "/tmp/ledger"),
        ("PI_DISPATCH_RUNNER_PID", "1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let env = environment(&runner, &[]);
    let program = find_command("env", Some("/usr/bin:/bin")).expect("env is in the image");
    let out = Command::new(program)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, _)| k)
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "HOME",
            "LANG",
            "PATH",
            "PI_DISPATCH_CHILD_LEDGER",
            "PI_DISPATCH_RUNNER_PID"
        ]
    );
    assert!(!text.contains("cnry"), "{text}");
}
