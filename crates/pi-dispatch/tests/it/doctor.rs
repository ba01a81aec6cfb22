//! `pi-dispatch doctor` end to end, on a realistic deployment.

use crate::common::{Deployment, Run, write_host_agent};

/// A nameserver on loopback that nothing answers on: the names doctor's egress proxy looks up are
/// asked there, never of this machine's resolver.
pub const NO_NAMESERVER: &str = "PI_EGRESS_NAMESERVER=127.0.0.1:9\n";

/// init, a realistic import, an allowlist and a declared endpoint.
pub fn realistic() -> Deployment {
    let d = Deployment::new();
    assert_eq!(d.run(&["init"]).code, 0);
    let env = std::fs::read_to_string(d.path().join(".env")).unwrap();
    std::fs::write(d.path().join(".env"), format!("{env}{NO_NAMESERVER}")).unwrap();
    let host = write_host_agent(d.path());
    assert_eq!(
        d.run(&["import-pi", "--from", host.to_str().unwrap()]).code,
        0
    );
    std::fs::write(
        d.path().join("egress-allowlist.conf"),
        "# hosts jobs may reach on 443\napi.github.com\n.example.com\n",
    )
    .unwrap();
    std::fs::write(
        d.path().join("model-endpoints.json"),
        r#"{"version": 1, "endpoints": [
            {"id": "llm", "host": "llm.internal.example", "port": 8443},
            {"id": "wiki", "host": "wiki.internal.example", "port": 8443}
        ]}"#,
    )
    .unwrap();
    d
}

fn json(run: &Run) -> serde_json::Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
}

/// The lines of doctor's output that a check failed.
fn failures(run: &Run) -> Vec<&str> {
    run.stdout.lines().filter(|l| l.starts_with('✗')).collect()
}

#[test]
fn a_realistic_deployment_reads_clearly() {
    let d = realistic();
    let run = d.run(&["doctor"]);
    // It fails for what the worker would refuse every job for: no image yet. Nothing else.
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert_eq!(
        failures(&run),
        ["✗ job image pi-job is not installed: jobs that use it are refused (job-image-missing)",],
        "{}",
        run.stdout
    );
    insta::assert_snapshot!("doctor_realistic", free_mib_masked(&d.redact(&run.stdout)));
}

/// The output with the free space of the state's disk, which changes from run to run, as `N`.
fn free_mib_masked(text: &str) -> String {
    text.lines()
        .map(|l| {
            match l
                .split_once("disk: ")
                .map(|(head, rest)| (head, rest.split_once(" MiB free")))
            {
                Some((head, Some((_, tail)))) => format!("{head}disk: N MiB free{tail}"),
                _ => l.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The state's disk is checked against PI_DISK_WARN_MB and PI_DISK_MIN_MB: with levels above
/// what any disk here has, a warning, then a failure that says no job starts; with the defaults,
/// fine (the control).
#[test]
fn the_room_left_on_the_states_disk_is_checked_against_both_levels() {
    let d = realistic();
    let env = std::fs::read_to_string(d.path().join(".env")).unwrap();
    let with =
        |extra: &str| std::fs::write(d.path().join(".env"), format!("{env}{extra}")).unwrap();
    let disk = |run: &Run| {
        json(run)["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "disk.state")
            .cloned()
            .unwrap_or_else(|| panic!("no disk check: {}", run.stdout))
    };
    let fine = disk(&d.run(&["doctor", "--json"]));
    assert_eq!(fine["level"], "ok", "{fine}");
    with("PI_DISK_WARN_MB=1073741824\n");
    let low = disk(&d.run(&["doctor", "--json"]));
    assert_eq!(low["level"], "warn", "{low}");
    assert!(
        low["label"].as_str().unwrap().contains("PI_DISK_WARN_MB"),
        "{low}"
    );
    with("PI_DISK_MIN_MB=1073741824\n");
    let full = disk(&d.run(&["doctor", "--json"]));
    assert_eq!(full["level"], "fail", "{full}");
    let label = full["label"].as_str().unwrap();
    assert!(
        label.contains("PI_DISK_MIN_MB") && label.contains("starts no job"),
        "{full}"
    );
}

#[test]
fn json_lists_every_check_with_level_label_and_fix() {
    let d = realistic();
    std::fs::write(d.path().join("pi-global/mcp-auth.json"), "{}").unwrap();
    let run = d.run(&["doctor", "--json"]);
    assert_eq!(run.code, 1);
    let report = json(&run);
    assert_eq!(report["ok"], false);
    let checks = report["checks"].as_array().unwrap();
    assert!(checks.len() >= 8);
    for c in checks {
        let level = c["level"].as_str().unwrap();
        assert!(["ok", "warn", "fail"].contains(&level), "{c}");
        assert!(c["label"].is_string());
        assert_eq!(c["fix"].is_string(), level != "ok", "{c}");
    }
    assert!(checks.iter().any(|c| c["level"] == "fail"
        && c["label"].as_str().unwrap().contains("mcp-auth.json")));
}

/// Each check has an id of its own, and keeps it whatever its outcome: scripts and the panel refer
/// to checks by it.
#[test]
fn json_checks_carry_stable_ids() {
    let ids = |run: &Run| -> Vec<(String, String)> {
        json(run)["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let id = c["id"].as_str().unwrap_or_else(|| panic!("no id: {c}"));
                (id.to_owned(), c["level"].as_str().unwrap().to_owned())
            })
            .collect()
    };
    let d = realistic();
    let before = ids(&d.run(&["doctor", "--json"]));
    assert!(before.len() >= 8);
    let mut unique: Vec<&str> = before.iter().map(|(id, _)| id.as_str()).collect();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), before.len(), "{before:?}");
    for (id, _) in &before {
        let (area, rest) = id.split_once('.').unwrap_or((id, ""));
        assert!(
            !area.is_empty()
                && area.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                && rest
                    .split(':')
                    .next()
                    .unwrap()
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '-'),
            "{id}"
        );
    }
    let level = |all: &[(String, String)], id: &str| {
        all.iter()
            .find(|(i, _)| i == id)
            .map(|(_, level)| level.clone())
    };
    assert_eq!(
        level(&before, "overlay.mcp-auth-json").as_deref(),
        Some("ok")
    );

    // The same check, failing, keeps its id; the others keep theirs.
    std::fs::write(d.path().join("pi-global/mcp-auth.json"), "{}").unwrap();
    let after = ids(&d.run(&["doctor", "--json"]));
    assert_eq!(
        level(&after, "overlay.mcp-auth-json").as_deref(),
        Some("fail")
    );
    let names = |all: &[(String, String)]| all.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>();
    assert_eq!(names(&before), names(&after));
}

#[test]
fn fix_without_a_terminal_deletes_nothing() {
    let d = realistic();
    let file = d.path().join("pi-global/mcp-auth.json");
    std::fs::write(&file, "{}").unwrap();
    let run = d.run(&["doctor", "--fix"]);
    assert_eq!(run.code, 1);
    assert!(file.exists());
    assert!(
        run.stdout
            .contains("not a terminal, so nothing was asked and nothing deleted"),
        "{}",
        run.stdout
    );
}

/// Runs doctor --fix under a real pseudo-terminal (util-linux `script`), answering `answer`.
fn fix_on_a_terminal(d: &Deployment, answer: &str) -> Run {
    let bin = env!("CARGO_BIN_EXE_pi-dispatch");
    let mut child = d.command(&[]).get_program().to_owned();
    let _ = &mut child;
    let mut cmd = std::process::Command::new("script");
    cmd.args(["-qec", &format!("{bin} doctor --fix"), "/dev/null"]);
    d.isolate(&mut cmd);
    let out = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(answer.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    out.into()
}

#[test]
fn fix_on_a_terminal_asks_and_deletes_only_on_yes() {
    let d = realistic();
    let file = d.path().join("pi-global/mcp-auth.json");
    std::fs::write(&file, "{}").unwrap();
    let run = fix_on_a_terminal(&d, "n\n");
    assert!(run.stdout.contains("Delete "), "{}", run.stdout);
    assert!(file.exists(), "{}", run.stdout);
    let run = fix_on_a_terminal(&d, "y\n");
    assert!(!file.exists(), "{}", run.stdout);
    assert!(run.stdout.contains("--fix: deleted"), "{}", run.stdout);
    assert!(
        run.stdout.contains("✓ no mcp-auth.json in the overlay"),
        "{}",
        run.stdout
    );
}

#[test]
fn fix_leaves_an_mcp_auth_folder_for_the_operator() {
    let d = realistic();
    let dir = d.path().join("pi-global/mcp-auth.json");
    std::fs::create_dir(&dir).unwrap();
    let run = fix_on_a_terminal(&d, "y\n");
    assert!(dir.is_dir(), "{}", run.stdout);
    assert!(run.stdout.contains("not a plain file"), "{}", run.stdout);
    assert!(
        run.stdout.contains("failed"),
        "the report is still printed: {}",
        run.stdout
    );
}

#[test]
fn hard_failures_exit_1_and_name_what_to_do() {
    // A bad setting.
    let d = realistic();
    std::fs::write(d.path().join(".env"), "PI_EGRESS=yes\n").unwrap();
    let run = d.run(&["doctor"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stdout.contains("✗ settings: PI_EGRESS must be"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("=yes"), "{}", run.stdout);

    // A linked overlay.
    let d = realistic();
    let real = d.path().join("real-overlay");
    std::fs::rename(d.path().join("pi-global"), &real).unwrap();
    std::os::unix::fs::symlink(&real, d.path().join("pi-global")).unwrap();
    let run = d.run(&["doctor"]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.contains("is a link"), "{}", run.stdout);

    // auth.json in the overlay; an unreadable mcp.json; a broken allowlist.
    for (file, text, words) in [
        ("pi-global/auth.json", "{}", "auth.json is in the overlay"),
        ("pi-global/mcp.json", "{,}", "mcp.json cannot be read"),
        (
            "egress-allowlist.conf",
            "https://api.github.com\n",
            "egress-allowlist.conf cannot be read",
        ),
        (
            "model-endpoints.json",
            "{\"version\": 2, \"endpoints\": []}",
            "model-endpoints.json cannot be read",
        ),
    ] {
        let d = realistic();
        std::fs::write(d.path().join(file), text).unwrap();
        let run = d.run(&["doctor"]);
        assert_eq!(run.code, 1, "{file}");
        assert!(
            run.stdout.contains(&format!("✗ {words}")),
            "{file}: {}",
            run.stdout
        );
    }
}

#[test]
fn each_fix_it_prints_works() {
    // Follow the fixes of a deployment with every warning the realistic one has, then doctor is clean.
    let d = realistic();
    let overlay = d.path().join("pi-global");
    std::fs::write(
        overlay.join("mcp.json"),
        r#"{"mcpServers": {
            "docs": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}, "description": "Docs"},
            "wiki": {"url": "https://wiki.example.com/mcp", "description": "Team wiki"}
        }}"#,
    )
    .unwrap();
    d.install_image(&[]);
    let run = d.run(&["doctor"]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(
        run.stdout
            .contains("    fix: set PI_PROVIDER and PI_MODEL in .env"),
        "{}",
        run.stdout
    );
    // Following that fix (the model of the overlay's models.json, with its key) leaves nothing.
    let env = std::fs::read_to_string(d.path().join(".env")).unwrap();
    std::fs::write(
        d.path().join(".env"),
        format!("{env}PI_PROVIDER=local\nPI_MODEL=qwen\nLOCAL_LLM_KEY=k-1\n"),
    )
    .unwrap();
    let run = d.run(&["doctor"]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    let warnings: Vec<&str> = run.stdout.lines().filter(|l| l.starts_with('⚠')).collect();
    assert!(warnings.is_empty(), "{}", run.stdout);
    assert!(
        run.stdout.contains(
            "✓ default model local/qwen: in the overlay's models.json, its key in LOCAL_LLM_KEY"
        ),
        "{}",
        run.stdout
    );
}

#[test]
fn the_deployment_folder_can_be_given_with_dir() {
    let d = realistic();
    let elsewhere = Deployment::new();
    let run = elsewhere.run(&["--dir", d.path().to_str().unwrap(), "doctor", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    let labels: Vec<String> = json(&run)["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        labels
            .iter()
            .any(|l| l.contains(&format!("{}/pi-global", d.path().display()))),
        "{labels:?}"
    );
    // The same flag after the subcommand.
    let run = elsewhere.run(&["mcp", "check", "--dir", d.path().to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stdout);
}

#[test]
fn a_key_written_twice_in_an_overlay_file_is_named() {
    let d = realistic();
    std::fs::write(
        d.path().join("pi-global/mcp.json"),
        "{\"mcpServers\": {\"docs\": {\"url\": \"https://mcp.example.com/mcp\",\n  \"url\": \"https://other.example.com/mcp\", \"description\": \"d\"}}}",
    )
    .unwrap();
    std::fs::write(
        d.path().join("pi-global/models.json"),
        r#"{"providers": {"p": {"apiKey": "$K", "apiKey": "$L"}}}"#,
    )
    .unwrap();
    let run = d.run(&["doctor"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    let failed: Vec<&str> = run.stdout.lines().filter(|l| l.starts_with('✗')).collect();
    insta::assert_snapshot!("duplicate_key_failures", failed.join("\n"));
}

#[test]
fn an_http_server_sending_a_credential_header_is_a_warning() {
    let d = realistic();
    std::fs::write(
        d.path().join("pi-global/mcp.json"),
        r#"{"mcpServers": {"wiki": {"url": "http://wiki.internal.example:8443/mcp", "headers": {"Authorization": "Bearer ${WIKI_TOKEN}"}, "description": "Team wiki"}}}"#,
    )
    .unwrap();
    let run = d.run(&["doctor"]);
    assert!(
        run.stdout.contains(
            "⚠ server wiki: the url is http://, so the credential in the header (Authorization) would be sent in plain text across the network to wiki.internal.example port 8443"
        ),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("    fix: use the server's https:// url\n"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_folder_that_is_not_a_deployment_fails_and_says_how_to_make_one() {
    let d = Deployment::new();
    let run = d.run(&["doctor"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    insta::assert_snapshot!("doctor_not_a_deployment", d.redact(&run.stdout));
    let run = d.run(&["doctor", "--json"]);
    assert_eq!(run.code, 1);
    assert_eq!(json(&run)["ok"], false);

    // init makes it one; a single file missing afterwards is a warning.
    assert_eq!(d.run(&["init"]).code, 0);
    std::fs::remove_file(d.path().join("triggers.json")).unwrap();
    let run = d.run(&["doctor"]);
    // It still fails, for what the worker would refuse a job for (no image yet).
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stdout.contains("job-image-missing"), "{}", run.stdout);
    assert!(
        d.redact(&run.stdout).contains(
            "⚠ the triggers file [DIR]/triggers.json does not exist: the worker has no trigger to run\n    fix: `pi-dispatch init [DIR]` writes an empty one"
        ),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("not a pi-dispatch deployment"));
}

#[test]
fn the_route_to_a_declared_endpoint_no_model_uses_is_proven_through_the_proxy() {
    // The realistic deployment's wiki server is on declared endpoint wiki, which no model uses:
    // from here its name does not resolve, and doctor says so.
    let d = realistic();
    let run = d.run(&["doctor"]);
    assert!(
        run.stdout.contains(
            "⚠ server wiki is on declared endpoint wiki (wiki.internal.example:8443), which no overlay model uses: its name does not resolve"
        ),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("    fix: check that the server runs and listens on that host and port"),
        "{}",
        run.stdout
    );
    // With the server running where its name leads (a test host, named by a nameserver of the
    // test's that the egress proxy asks), doctor proves the route through the proxy.
    let host = testkit::netns::TestHost::new();
    let listener = host.tcp(8443);
    std::thread::spawn(move || {
        for s in listener.incoming() {
            // An https server closing a plain request counts as an answer.
            drop(s);
        }
    });
    let dns = testkit::dns::FakeDns::start();
    dns.set("wiki.internal.example", &[std::net::IpAddr::V4(host.v4)]);
    let env = std::fs::read_to_string(d.path().join(".env")).unwrap();
    std::fs::write(
        d.path().join(".env"),
        env.replace(
            NO_NAMESERVER,
            &format!("PI_EGRESS_NAMESERVER={}\n", dns.addr),
        ),
    )
    .unwrap();
    let run = d.run(&["doctor"]);
    assert!(
        run.stdout.contains(
            "✓ server wiki: the route to declared endpoint wiki (wiki.internal.example:8443) is proven"
        ),
        "{}",
        run.stdout
    );
    assert!(dns.asked("wiki.internal.example") > 0);
}

#[test]
fn the_bubblewrap_check_starts_a_job_sandbox_the_way_the_worker_does() {
    let d = realistic();
    d.install_image(&[]);
    let run = d.run(&["doctor"]);
    assert!(
        run.stdout.contains(
            "✓ bubblewrap: /usr/bin/bwrap, a job's sandbox starts and confines its processes"
        ),
        "{}",
        run.stdout
    );
    // A root worker in a user namespace that maps root alone (as in a container given one uid):
    // bubblewrap is installed, but no job's sandbox can change to the job's user, so doctor fails
    // where it used to pass.
    let mut alone = std::process::Command::new("unshare");
    alone.args(["--user", "--map-root-user", "--"]);
    alone.arg(env!("CARGO_BIN_EXE_pi-dispatch")).arg("doctor");
    d.isolate(&mut alone);
    let run = crate::common::Run::from(alone.output().unwrap());
    assert_eq!(run.code, 1, "{}", run.stdout);
    let failed = failures(&run);
    assert!(
        failed.iter().any(|l| l
            .starts_with("✗ bubblewrap is installed but a job's sandbox does not start: ")
            && l.ends_with("(every job would end container-never-started)")),
        "{}",
        run.stdout
    );
}

#[test]
fn the_forges_keys_and_settings_are_checked_as_the_worker_reads_them() {
    let d = realistic();
    let env = std::fs::read_to_string(d.path().join(".env")).unwrap();
    let with =
        |extra: &str| std::fs::write(d.path().join(".env"), format!("{env}{extra}")).unwrap();
    // A key file that is not a key: failed, naming the setting, and nothing of the file.
    d.write("app-key.pem", "CNRY-not-a-key-91aa\n");
    d.write(
        "triggers.json",
        r#"{"triggers": [{"on": {"type": "label", "any": ["pi-answer"]}, "run": {"kind": "github", "flow": "answer"}}]}"#,
    );
    // An image as far as the admission looks (its runner and labels), so that it gets to the forge.
    d.write("images/pi-job/bin/pi-dispatch", "");
    d.write(
        "images/pi-job/image.json",
        r#"{"labels": {"dev.pi-dispatch.capabilities": "mcp,forgeMcp"}}"#,
    );
    with(
        "PI_GITHUB_APP_ID=4242\nPI_GITHUB_APP_KEY_FILE=app-key.pem\nPI_PROVIDER=openai\nPI_MODEL=gpt-4o-mini\nOPENAI_API_KEY=k\n",
    );
    let run = d.run(&["doctor"]);
    assert_eq!(run.code, 1);
    let failed = failures(&run).join("\n");
    assert!(
        failed.contains("the GitHub App's key") && failed.contains("forge-unconfigured"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("PI_GITHUB_APP_KEY_FILE"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("CNRY") && !run.stderr.contains("CNRY"));
    // ... and no github trigger is said to be admitted while the key cannot sign: doctor and
    // explain answer as the worker will.
    let trigger = run
        .stdout
        .lines()
        .find(|l| l.contains("trigger 0 (label -> github)"))
        .unwrap_or_else(|| panic!("no line for the github trigger: {}", run.stdout));
    assert!(
        !trigger.contains("would be admitted") && trigger.contains("forge-unconfigured"),
        "{trigger}"
    );
    // A real key, readable by others: it signs, with a warning to keep it private.
    let key = testkit::fake_forge::app_key_pem();
    let path = d.write("app-key.pem", &key);
    crate::worker::chmod(&path, 0o644);
    let run = d.run(&["doctor"]);
    assert!(
        run.stdout.contains("✓ GitHub App 4242: its key") && run.stdout.contains("chmod 600"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains(&crate::forge::key_canary(&key)));
    crate::worker::chmod(&path, 0o600);
    let run = d.run(&["doctor"]);
    assert!(!run.stdout.contains("chmod 600"), "{}", run.stdout);
    // Half a forge: failed.
    with("PI_GITHUB_APP_ID=4242\nGITLAB_URL=https://gitlab.example.com\n");
    let run = d.run(&["doctor"]);
    let failed = failures(&run).join("\n");
    assert!(
        failed.contains("GitHub App is half set up") && failed.contains("GitLab is half set up"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_redis_queue_is_checked_for_its_answer_version_and_persistence() {
    let d = realistic();
    let env = std::fs::read_to_string(d.path().join(".env")).unwrap();
    let with = |queue: &str| {
        std::fs::write(d.path().join(".env"), format!("{env}PI_QUEUE={queue}\n")).unwrap()
    };
    let plain = testkit::redis::RedisServer::start();
    with(&plain.url());
    let run = d.run(&["doctor"]);
    assert!(
        run.stdout.contains("✓ queue: Redis 7.") && run.stdout.contains("answers"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("⚠ queue: Redis has no append-only file"),
        "{}",
        run.stdout
    );
    let kept = testkit::redis::RedisServer::start_with(true);
    with(&kept.url());
    let run = d.run(&["doctor"]);
    assert!(
        run.stdout
            .contains("✓ queue: Redis keeps an append-only file"),
        "{}",
        run.stdout
    );
    // Nothing there: a failure that names the setting.
    let gone = d.path().join("no-redis.sock");
    with(&format!("redis+unix://{}", gone.display()));
    let run = d.run(&["doctor"]);
    assert_eq!(run.code, 1);
    assert!(
        failures(&run).join("\n").contains("the queue's Redis") && run.stdout.contains("PI_QUEUE"),
        "{}",
        run.stdout
    );
}
