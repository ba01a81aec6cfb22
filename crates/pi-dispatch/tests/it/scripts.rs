//! The README's two commands as they are written: `scripts/run` installs only what the demo needs
//! and says each long step before it starts it, `scripts/test` installs the rest, and the README
//! names every package each one installs.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_owned()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap()
}

/// The Debian packages a script installs: each `packages+=(NAME)`.
fn debian_packages(script: &str) -> Vec<String> {
    script
        .lines()
        .filter_map(|l| l.split("packages+=(").nth(1)?.split(')').next())
        .map(str::to_owned)
        .collect()
}

/// The README's bullet that starts with `- \`scripts/NAME\``, up to the next bullet or paragraph.
fn readme_bullet(readme: &str, script: &str) -> String {
    let start = readme
        .find(&format!("- `scripts/{script}`"))
        .unwrap_or_else(|| panic!("the README has no bullet for scripts/{script}"));
    let rest = &readme[start + 2..];
    let end = rest
        .find("\n- ")
        .into_iter()
        .chain(rest.find("\n\n"))
        .min()
        .unwrap_or(rest.len());
    rest[..end].to_owned()
}

#[test]
fn each_script_installs_what_the_readme_says_and_the_demo_only_what_it_needs() {
    let install = read("scripts/install");
    let tests = read("scripts/install-tests");
    let readme = read("README.md");
    let demo = debian_packages(&install);
    let extra = debian_packages(&tests);
    // The probe reads the scripts: both name packages.
    assert!(demo.contains(&"bubblewrap".to_owned()), "{demo:?}");
    assert!(extra.contains(&"podman".to_owned()), "{extra:?}");
    let run_bullet = readme_bullet(&readme, "run");
    let test_bullet = readme_bullet(&readme, "test");
    for package in &demo {
        assert!(
            run_bullet.contains(package.as_str()),
            "the README does not say that scripts/run installs {package}"
        );
        assert!(
            !extra.contains(package),
            "{package} is installed by both scripts"
        );
    }
    for package in &extra {
        assert!(
            test_bullet.contains(package.as_str()),
            "the README does not say that scripts/test installs {package}"
        );
        assert!(
            !run_bullet.contains(package.as_str()),
            "the README says that scripts/run installs {package}"
        );
    }
    // What only the tests use stays out of the demo's install and the demo itself.
    for only_tests in [
        ".tools",
        "mmdebstrap",
        "forge-mcp",
        "python3-pip",
        "pip download",
    ] {
        assert!(
            !install.contains(only_tests),
            "scripts/install mentions {only_tests}"
        );
        assert!(
            !read("scripts/run").contains(only_tests),
            "scripts/run mentions {only_tests}"
        );
    }
    assert!(read("scripts/test").contains("bash scripts/install-tests"));
    assert!(tests.contains("bash scripts/install\n"));
}

#[test]
fn the_demo_says_each_long_step_before_it_starts_it() {
    let run = read("scripts/run");
    // Each command that can take minutes comes after a step line of its own, with nothing long
    // between them, and cargo shows its progress (never --quiet).
    let long = [
        "bash scripts/install",
        "cargo install",
        "cargo build",
        "pi-dispatch image install",
        "pi-dispatch worker",
    ];
    let lines: Vec<&str> = run.lines().map(str::trim_start).collect();
    for command in long {
        let at = lines
            .iter()
            .position(|l| l.starts_with(command))
            .unwrap_or_else(|| panic!("scripts/run does not run {command}"));
        let said = lines[..at].iter().rposition(|l| l.starts_with("say \""));
        let previous_long = lines[..at]
            .iter()
            .rposition(|l| long.iter().any(|c| l.starts_with(c)));
        assert!(
            said.is_some() && said > previous_long,
            "scripts/run starts `{command}` without saying so first"
        );
    }
    assert!(
        !run.contains("--quiet"),
        "a step of scripts/run hides its progress"
    );
    let steps = lines.iter().filter(|l| l.starts_with("say \"")).count();
    assert!(
        run.contains(&format!("steps={steps}\n")),
        "scripts/run counts {steps} steps otherwise"
    );
}
