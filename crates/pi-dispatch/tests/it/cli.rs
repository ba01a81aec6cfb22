//! The command line as an operator meets it: the commands `--help` lists, the global flags on
//! either side of a subcommand, what an unknown id or a wrong folder is told, `status` on a fresh
//! deployment, and the worker's log lines.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::common::{Deployment, Run};

/// A deployment folder `init` wrote.
fn deployment() -> Deployment {
    let d = Deployment::new();
    let init = d.run(&["init"]);
    assert_eq!(init.code, 0, "{}", init.stderr);
    d
}

#[test]
fn help_lists_the_commands_in_their_order_and_hides_the_internal_ones() {
    let d = Deployment::new();
    let run = d.run(&["--help"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let commands: Vec<&str> = run
        .stdout
        .lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let expected = [
        "init",
        "import-pi",
        "doctor",
        "image",
        "run",
        "worker",
        "receiver",
        "egress-proxy",
        "panel",
        "status",
        "runs",
        "cancel",
        "rerun",
        "prune",
        "explain",
        "triggers",
        "mcp",
        "completions",
    ];
    let listed = commands.strip_suffix(&["help"]).unwrap_or(&commands);
    assert_eq!(listed, expected, "{}", run.stdout);
}

/// A folder to run commands from that is not a deployment: its `.env` cannot be read, so a command
/// that looked here instead of at `--dir` would fail.
fn elsewhere() -> Deployment {
    let cwd = Deployment::new();
    cwd.write(".env", "this is not a setting\n");
    cwd
}

#[test]
fn dir_is_taken_before_and_after_the_subcommand() {
    let d = deployment();
    let dir = d.path().to_str().unwrap();
    let cwd = elsewhere();
    // Without --dir the folder it runs in is the deployment, and its .env is refused.
    assert_eq!(cwd.run(&["status"]).code, 2);
    for args in [["--dir", dir, "status"], ["status", "--dir", dir]] {
        let run = cwd.run(&args);
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        assert!(run.stdout.contains("The queue is empty"), "{}", run.stdout);
    }

    d.write(
        "pi-global/mcp.json",
        r#"{"mcpServers": {"wiki": {"url": "https://wiki.example.com/mcp", "description": "Team wiki"}}}"#,
    );
    for args in [
        ["--dir", dir, "mcp", "check"],
        ["mcp", "--dir", dir, "check"],
        ["mcp", "check", "--dir", dir],
    ] {
        let run = cwd.run(&args);
        assert_eq!(run.code, 0, "{args:?}: {}{}", run.stdout, run.stderr);
        assert!(run.stdout.contains(dir), "{args:?}: {}", run.stdout);
        assert!(run.stdout.contains("wiki"), "{args:?}: {}", run.stdout);
    }
}

/// A folder that is no deployment is said to be one by every command that reads a deployment
/// (exit 2, the folder and `--dir` named), never answered as an empty one; `PI_DIR` names the
/// deployment for a shell.
#[test]
fn a_folder_that_is_no_deployment_is_said_to_be_none() {
    let d = deployment();
    let nowhere = Deployment::new();
    for args in [
        &["status"][..],
        &["runs"][..],
        &["runs", "show", "x"][..],
        &["cancel", "x"][..],
        &["worker", "--until-empty"][..],
        &["explain", "--trigger", "0"][..],
    ] {
        let run = nowhere.run(args);
        assert_eq!(run.code, 2, "{args:?}: {}{}", run.stdout, run.stderr);
        assert!(
            run.stderr.contains("is not a pi-dispatch deployment")
                && run.stderr.contains("--dir")
                && run.stderr.contains(&nowhere.path().display().to_string()),
            "{args:?}: {}",
            run.stderr
        );
        assert_eq!(run.stdout, "", "{args:?}");
    }
    // PI_DIR names the deployment; --dir still wins over it.
    let run = Run::from(
        nowhere
            .command(&["status"])
            .env("PI_DIR", d.path())
            .output()
            .unwrap(),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("The queue is empty"), "{}", run.stdout);
    let run = Run::from(
        d.command(&["status", "--dir", nowhere.path().to_str().unwrap()])
            .env("PI_DIR", d.path())
            .output()
            .unwrap(),
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
}

/// A worker whose standard error is full, or a pipe nobody reads any more, goes on, and still
/// stops when told (SIGTERM).
#[test]
fn a_worker_whose_standard_error_is_gone_goes_on_and_stops_when_told() {
    let d = deployment();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let run = Run::from(
        d.command(&["worker", "--until-empty", "--poll-ms", "50"])
            .stderr(full)
            .output()
            .unwrap(),
    );
    assert_eq!(run.code, 0, "a full standard error: {}", run.stdout);
    // A pipe whose reader went away, then SIGTERM.
    let mut child = d
        .command(&["worker", "--poll-ms", "50"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(&mut stderr, &mut first).unwrap();
    drop(stderr);
    std::thread::sleep(Duration::from_millis(300));
    let pid = child.id().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > until {
            let _ = child.kill();
            panic!("the worker did not stop on SIGTERM with its standard error closed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn log_format_is_taken_before_and_after_the_subcommand() {
    let d = deployment();
    for args in [
        ["--log-format", "json", "worker", "--until-empty"],
        ["worker", "--until-empty", "--log-format", "json"],
    ] {
        let run = d.run(&args);
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        assert!(!run.stderr.is_empty(), "{args:?}");
        for line in run.stderr.lines() {
            assert!(
                serde_json::from_str::<Value>(line).is_ok(),
                "{args:?}: {line}"
            );
        }
    }
    for args in [
        ["--log-format", "text", "worker", "--until-empty"],
        ["worker", "--until-empty", "--log-format", "text"],
    ] {
        let run = d.run(&args);
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        assert!(
            run.stderr.contains("worker_started"),
            "{args:?}: {}",
            run.stderr
        );
        assert!(
            run.stderr.lines().all(|l| !l.starts_with('{')),
            "{args:?}: {}",
            run.stderr
        );
    }
    let run = d.run(&["status", "--log-format", "yaml"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("--log-format"), "{}", run.stderr);
}

#[test]
fn an_unknown_id_is_said_with_where_it_was_looked_for() {
    let d = deployment();
    let run = d.run(&["runs", "show", "cli-0-unknown"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("cli-0-unknown"), "{}", run.stderr);
    let records = d.path().join("state").join("queue.sqlite3");
    assert!(
        run.stderr.contains(records.to_str().unwrap()),
        "{}",
        run.stderr
    );

    // Before any job was queued (no queue file), and once the queue exists.
    let run = d.run(&["cancel", "cli-0-unknown"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("cli-0-unknown"), "{}", run.stderr);
    assert_eq!(d.run(&["worker", "--until-empty"]).code, 0);
    let run = d.run(&["cancel", "cli-0-unknown"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("cli-0-unknown"), "{}", run.stderr);
}

#[test]
fn status_of_a_fresh_deployment() {
    let d = deployment();
    let run = d.run(&["status"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("The queue is empty"), "{}", run.stdout);

    let run = d.run(&["status", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert!(report["counts"].is_object(), "{report}");
    assert_eq!(report["counts"]["queued"], 0, "{report}");
    assert_eq!(report["open"], serde_json::json!([]), "{report}");
}

/// Whether `text` is an RFC 3339 time in UTC as the logs write it: `YYYY-MM-DDTHH:MM:SS`, an
/// optional fraction, then `Z`.
fn is_utc_timestamp(text: &str) -> bool {
    let b = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| {
        b.get(range)
            .is_some_and(|s| s.iter().all(u8::is_ascii_digit))
    };
    let fixed = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !fixed {
        return false;
    }
    match &b[19..] {
        b"Z" => true,
        [b'.', rest @ .., b'Z'] => !rest.is_empty() && rest.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

#[test]
fn the_timestamp_pattern_is_strict() {
    for good in [
        "2026-01-02T03:04:05Z",
        "2026-01-02T03:04:05.123456Z",
        "2026-01-02T03:04:05.1Z",
    ] {
        assert!(is_utc_timestamp(good), "{good}");
    }
    for bad in [
        "2026-01-02 03:04:05Z",
        "2026-01-02T03:04:05",
        "2026-01-02T03:04:05+00:00",
        "2026-01-02T03:04:05.Z",
        "2026-1-02T03:04:05Z",
        "1767322445",
        "2026-01-02T03:04:05.12aZ",
    ] {
        assert!(!is_utc_timestamp(bad), "{bad}");
    }
}

/// The events of a JSON log, checking that every line is one object with a timestamp and a level.
fn json_events(stderr: &str) -> Vec<Value> {
    assert!(!stderr.is_empty());
    stderr
        .lines()
        .map(|line| {
            let event: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}"));
            assert!(event.is_object(), "{line}");
            let time = event["timestamp"].as_str().unwrap_or_default();
            assert!(is_utc_timestamp(time), "timestamp: {line}");
            assert!(
                matches!(
                    event["level"].as_str(),
                    Some("TRACE" | "DEBUG" | "INFO" | "WARN" | "ERROR")
                ),
                "level: {line}"
            );
            event
        })
        .collect()
}

#[test]
fn worker_log_lines_carry_a_timestamp_and_a_level() {
    let d = deployment();
    let run = d.run(&["worker", "--until-empty", "--log-format", "json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let events: Vec<String> = json_events(&run.stderr)
        .iter()
        .map(|e| e["event"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(events.first().map(String::as_str), Some("worker_started"));
    assert_eq!(events.last().map(String::as_str), Some("worker_stopped"));

    let run = d.run(&["worker", "--until-empty"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.lines().count() >= 2, "{}", run.stderr);
    for line in run.stderr.lines() {
        let (time, rest) = line.split_once(' ').unwrap_or((line, ""));
        assert!(is_utc_timestamp(time), "{line}");
        assert!(
            ["INFO", "WARN", "ERROR", "DEBUG", "TRACE"]
                .contains(&rest.split_whitespace().next().unwrap_or("")),
            "{line}"
        );
    }
    assert!(run.stderr.contains("worker_started") && run.stderr.contains("worker_stopped"));
}

/// Runs a worker of `d` (with `args`) for `run`, then tells it to stop (SIGTERM): it must exit 0.
fn worker_for(d: &Deployment, args: &[&str], run: Duration) -> Run {
    let mut all = vec!["worker"];
    all.extend_from_slice(args);
    let child = d
        .command(&all)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(run);
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let run = Run::from(child.wait_with_output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    run
}

/// A deployment whose triggers file is refused (`triggers[0].run.flaw` is no field of a run).
fn refused_triggers() -> Deployment {
    let d = deployment();
    d.write(
        "triggers.json",
        r#"{"triggers": [{"on": {"type": "cron", "id": "nightly", "pattern": "0 3 * * *"},
            "run": {"kind": "local", "folder": "/srv/repo", "task": "t", "flaw": "task"}}]}"#,
    );
    d
}

#[test]
fn a_refused_triggers_file_is_logged_once_with_why() {
    let d = refused_triggers();
    // A worker that runs cron triggers: it reads the file once a second.
    let run = worker_for(&d, &["--log-format", "json"], Duration::from_millis(3500));
    let refused: Vec<Value> = json_events(&run.stderr)
        .into_iter()
        .filter(|e| e["event"] == "cron_triggers_refused")
        .collect();
    assert_eq!(refused.len(), 1, "{}", run.stderr);
    let why = refused[0]["why"].as_str().unwrap_or_default();
    assert!(why.contains("triggers[0].run.flaw"), "{why}");
    assert_eq!(refused[0]["level"], "ERROR");
}

/// The `key=value` pairs of a text log line after its time and level, or why it is not logfmt:
/// each value a bare word, or a quoted string with `\"` and `\\` escaped.
fn logfmt(rest: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek() == Some(&' ') {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let key: String =
            std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ' ')).collect();
        if chars.next() != Some('=') || key.is_empty() {
            return Err(format!("no key=value at {key:?}"));
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') => break,
                    Some('\\') => value.push(chars.next().ok_or("a lone backslash")?),
                    Some(c) => value.push(c),
                    None => return Err(format!("{key}: an unclosed quote")),
                }
            }
            if chars.peek().is_some_and(|c| *c != ' ') {
                return Err(format!("{key}: text after the closing quote"));
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ' ')).collect();
            if value.contains('"') || value.contains('=') {
                return Err(format!("{key}: a bare value holding a quote or '='"));
            }
        }
        pairs.push((key, value));
    }
}

/// Text log lines read back as logfmt, a value with spaces and quotes included.
#[test]
fn text_log_lines_are_logfmt() {
    let d = refused_triggers();
    let run = worker_for(&d, &[], Duration::from_millis(2500));
    let mut why = None;
    for line in run.stderr.lines() {
        let (time, rest) = line.split_once(' ').unwrap_or((line, ""));
        assert!(is_utc_timestamp(time), "{line}");
        let (level, fields) = rest.trim_start().split_once(' ').unwrap_or((rest, ""));
        assert!(
            ["INFO", "WARN", "ERROR", "DEBUG", "TRACE"].contains(&level),
            "{line}"
        );
        let pairs = logfmt(fields).unwrap_or_else(|e| panic!("{e}: {line}"));
        if let Some((_, v)) = pairs.iter().find(|(k, _)| k == "why") {
            why = Some(v.clone());
        }
    }
    // The control: a value with spaces and quotes was logged, and reads back whole.
    let why = why.unwrap_or_else(|| panic!("no why= in {}", run.stderr));
    assert!(
        why.contains("triggers[0].run.flaw") && why.contains(' '),
        "{why}"
    );
}

/// A Redis that does not answer is said at once, where it was looked for (never the password),
/// not after a whole outage's wait.
#[test]
fn a_redis_that_does_not_answer_is_named_at_once() {
    let d = deployment();
    // Port 1 of loopback: nothing listens, so every connection is refused.
    d.write(
        ".env",
        "PI_QUEUE=redis://127.0.0.1:1\nPI_QUEUE_PASSWORD=CNRY-redis-password-77\n",
    );
    let started = std::time::Instant::now();
    let run = d.run(&["status"]);
    let took = started.elapsed();
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("127.0.0.1:1"), "{}", run.stderr);
    assert!(
        !run.stderr.contains("CNRY-redis-password"),
        "{}",
        run.stderr
    );
    // The first contact's bound (6 s), not the outage limit (60 s).
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn run_names_the_folder_it_cannot_use() {
    let d = deployment();
    let file = d.write("notes.txt", "not a repository\n");
    std::fs::create_dir_all(d.path().join("plain")).unwrap();
    let given_file = file.to_str().unwrap();
    for given in ["no-such-repo", given_file, "plain"] {
        let run = d.run(&["run", given, "--task", "Fix the build."]);
        assert_eq!(run.code, 2, "{given}: {}", run.stderr);
        assert!(run.stderr.contains(given), "{given}: {}", run.stderr);
        assert!(!run.stderr.contains("FOLDER"), "{given}: {}", run.stderr);
    }
}

#[test]
fn version_names_the_commit_and_the_pinned_pi() {
    let d = Deployment::new();
    let run = d.run(&["--version"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let git = std::process::Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .unwrap();
    assert!(git.status.success());
    let commit = String::from_utf8_lossy(&git.stdout).trim().to_owned();
    let package: Value =
        serde_json::from_slice(&std::fs::read(root.join("package.json")).unwrap()).unwrap();
    let pi = package["dependencies"]["@earendil-works/pi-coding-agent"]
        .as_str()
        .unwrap();
    assert_eq!(
        run.stdout.trim(),
        format!(
            "pi-dispatch {} (commit {commit}, pi {pi})",
            env!("CARGO_PKG_VERSION")
        )
    );
    // A subcommand says the same, under its own name.
    assert_eq!(
        d.run(&["doctor", "--version"]).stdout,
        run.stdout.replacen("pi-dispatch", "pi-dispatch-doctor", 1)
    );
}

#[test]
fn bash_completes_the_commands_and_hides_the_internal_ones() {
    let d = Deployment::new();
    let script = d.run(&["completions", "bash"]);
    assert_eq!(script.code, 0, "{}", script.stderr);
    let complete = |words: &str| -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pi-dispatch.bash");
        std::fs::write(&file, &script.stdout).unwrap();
        let n = words.split_whitespace().count();
        // The function the script registers for the program, called as bash calls it.
        let line = format!(
            "source '{}'; f=$(complete -p pi-dispatch | sed -E 's/.*-F ([^ ]+).*/\\1/'); \
             echo \"function: $f\"; COMP_WORDS=({words}); COMP_CWORD={}; COMP_LINE='{words}'; \
             COMP_POINT=${{#COMP_LINE}}; \"$f\" pi-dispatch '{}' '{}'; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            file.display(),
            n - 1,
            words.split_whitespace().last().unwrap_or_default(),
            words
                .split_whitespace()
                .nth(n.saturating_sub(2))
                .unwrap_or_default(),
        );
        let stdout = crate::common::succeeds(std::process::Command::new("bash").args([
            "--norc",
            "--noprofile",
            "-c",
            &line,
        ]));
        // The control: the script registered a function, and it was called.
        let (first, rest) = stdout.split_once('\n').unwrap_or_default();
        assert!(first.starts_with("function: _"), "{stdout}");
        rest.split_whitespace().map(str::to_owned).collect()
    };
    assert_eq!(complete("pi-dispatch ru"), ["run", "runs"]);
    assert_eq!(complete("pi-dispatch re"), ["receiver", "rerun"]);
    // The runner's own commands are not offered.
    assert!(complete("pi-dispatch jo").is_empty());
    assert!(complete("pi-dispatch man").is_empty());
    // A subcommand's flags.
    assert!(complete("pi-dispatch prune --").contains(&"--dry-run".to_owned()));
    assert!(complete("pi-dispatch runs show --").contains(&"--follow".to_owned()));
    // The other shells' scripts name the program.
    for (shell, mark) in [
        ("zsh", "#compdef pi-dispatch"),
        ("fish", "complete -c pi-dispatch"),
    ] {
        let run = d.run(&["completions", shell]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert!(run.stdout.contains(mark), "{shell}: {}", run.stdout);
    }
    let unknown = d.run(&["completions", "tcsh"]);
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
}

#[test]
fn the_manual_page_renders_cleanly_and_lists_the_commands() {
    let d = Deployment::new();
    let page = d.run(&["man-page"]);
    assert_eq!(page.code, 0, "{}", page.stderr);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pi-dispatch.1");
    std::fs::write(&file, &page.stdout).unwrap();
    let out = std::process::Command::new("man")
        .args(["--warnings", "-E", "UTF-8", "-l"])
        .arg(&file)
        .env("MANWIDTH", "100")
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{warnings}");
    assert!(warnings.trim().is_empty(), "{warnings}");
    assert!(text.contains("pi-dispatch"), "{text}");
    for command in ["init", "doctor", "worker", "rerun", "completions"] {
        assert!(
            text.lines().any(|l| l
                .trim_start()
                .starts_with(&format!("pi-dispatch-{command}"))
                || l.trim_start().starts_with(command)),
            "{command} is not on the page:\n{text}"
        );
    }
    assert!(!text.contains("job-guard"), "{text}");
}
