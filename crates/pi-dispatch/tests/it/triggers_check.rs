//! `pi-dispatch triggers check` end to end: valid, refused and unreadable files, both formats, where
//! the file is found, and that no value ever reaches the output.

use serde_json::{Value, json};

use crate::common::Deployment;

const VALID: &str = r#"{
  "triggers": [
    {
      "on": { "type": "label", "any": ["docs"], "none": ["wip"] },
      "run": {
        "kind": "github",
        "flow": "answer",
        "mcp": ["docs", "forge"],
        "secrets": { "DOCS_TOKEN": "op://ci/docs/token" },
        "secretsProfile": "ci"
      }
    },
    {
      "on": { "type": "cron", "id": "nightly", "pattern": "0 3 * * *" },
      "run": {
        "kind": "local",
        "command": "make nightly",
        "folder": "/srv/repo",
        "task": "Run the nightly checks.\nReport what failed."
      }
    },
    {
      "on": { "type": "comment", "phrase": "/pi review" },
      "run": {
        "kind": "gitlab",
        "flow": "review",
        "provider": "anthropic",
        "model": "claude-sonnet",
        "models": ["anthropic/claude-sonnet", "openai/gpt-5"],
        "maxCostUsd": 2.5
      }
    },
    {
      "on": { "type": "pull_request", "action": "opened" },
      "run": { "kind": "forgejo", "command": "pi review the change", "mcp": ["wiki"] }
    },
    {
      "on": { "type": "issue", "action": "labeled" },
      "run": { "kind": "azure", "flow": "triage", "excludeTools": ["bash"], "image": "pi-job" }
    }
  ]
}"#;

/// Errors in two triggers (0 and 2); trigger 1 is valid.
const INVALID: &str = r#"{
  "triggers": [
    {
      "on": { "type": "label", "none": ["wip"] },
      "run": { "kind": "forgejo", "flow": "answer", "mcp": ["forge"] }
    },
    {
      "on": { "type": "comment", "phrase": "/pi review" },
      "run": { "kind": "github", "flow": "review" }
    },
    {
      "on": { "type": "cron", "id": "nightly", "pattern": "0 3 * * *" },
      "run": { "kind": "github", "command": "make nightly", "model": "claude-sonnet", "colour": "red" }
    }
  ]
}"#;

/// `config::triggers::MAX_FILE_BYTES` (the tests drive the binary and do not link the library).
const MAX_FILE_BYTES: usize = 8 * 1024 * 1024;

fn json_of(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// An overlay `mcp.json` offering the servers [`VALID`] names.
const OVERLAY: &str = r#"{"mcpServers": {
  "docs": {"url": "https://mcp.example.com/mcp", "description": "Docs"},
  "wiki": {"url": "https://wiki.example.com/mcp", "description": "Wiki"}
}}"#;

#[test]
fn a_valid_file_passes() {
    let d = Deployment::new();
    d.write("triggers.json", VALID);
    d.write("pi-global/mcp.json", OVERLAY);
    let run = d.run(&["triggers", "check"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stderr, "");
    insta::assert_snapshot!("valid_human", d.redact(&run.stdout));

    let run = d.run(&["triggers", "check", "--json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report = json_of(&run.stdout);
    let keys: Vec<&str> = report
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    // serde_json's map sorts its keys.
    assert_eq!(
        keys,
        ["code", "errors", "file", "triggers", "valid", "warnings"]
    );
    assert_eq!(report["warnings"], json!([]));
    assert!(report["file"].as_str().unwrap().ends_with("/triggers.json"));
    assert_eq!(report["valid"], true);
    assert_eq!(report["code"], Value::Null);
    assert_eq!(report["errors"], json!([]));
    assert_eq!(
        report["triggers"],
        json!([
            {"index": 0, "type": "label", "kind": "github", "mcp": ["docs", "forge"]},
            {"index": 1, "type": "cron", "kind": "local", "mcp": null},
            {"index": 2, "type": "comment", "kind": "gitlab", "mcp": null},
            {"index": 3, "type": "pull_request", "kind": "forgejo", "mcp": ["wiki"]},
            {"index": 4, "type": "issue", "kind": "azure", "mcp": null},
        ])
    );
}

#[test]
fn an_empty_list_of_triggers_is_valid() {
    let d = Deployment::new();
    d.write("triggers.json", "{\"triggers\": []}\n");
    let run = d.run(&["triggers", "check"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.ends_with("\n0 triggers: all valid\n"),
        "{}",
        run.stdout
    );
}

#[test]
fn an_invalid_file_exits_1_and_lists_every_error() {
    let d = Deployment::new();
    d.write("triggers.json", INVALID);
    let run = d.run(&["triggers", "check"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stderr, "");
    insta::assert_snapshot!("invalid_human", d.redact(&run.stdout));

    let run = d.run(&["triggers", "check", "--json"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let report = json_of(&run.stdout);
    assert_eq!(report["valid"], false);
    assert_eq!(report["code"], "triggers-invalid");
    assert_eq!(report["triggers"], json!([]));
    let errors = report["errors"].as_array().unwrap();
    for e in errors {
        assert_eq!(e.as_object().unwrap().len(), 2, "{e}");
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    }
    let paths: Vec<&str> = errors.iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "triggers[0].on",
            "triggers[0].run.mcp[0]",
            "triggers[2].run.colour",
            "triggers[2].run.kind",
            "triggers[2].run.model",
        ]
    );
    // Every error of the JSON report is a line of the human one.
    let human = d.run(&["triggers", "check"]).stdout;
    assert!(
        human.contains(&format!("refused whole ({} errors):", errors.len())),
        "{human}"
    );
    for e in errors {
        let line = format!(
            "    {}: {}\n",
            e["path"].as_str().unwrap(),
            e["message"].as_str().unwrap()
        );
        assert!(human.contains(&line), "{line} not in:\n{human}");
    }
}

#[test]
fn a_wrong_top_level_is_refused_for_the_file_as_a_whole() {
    for text in ["[]", "{\"triggers\": {}}", "{\"jobs\": []}"] {
        let d = Deployment::new();
        d.write("triggers.json", text);
        let run = d.run(&["triggers", "check", "--json"]);
        assert_eq!(run.code, 1, "{text}: {}{}", run.stdout, run.stderr);
        let report = json_of(&run.stdout);
        assert_eq!(report["code"], "triggers-invalid", "{text}");
        assert!(!report["errors"].as_array().unwrap().is_empty(), "{text}");
        let human = d.run(&["triggers", "check"]);
        assert_eq!(human.code, 1, "{text}");
        assert!(
            human.stdout.contains("✗ the file is refused whole ("),
            "{}",
            human.stdout
        );
    }
}

#[test]
fn an_unreadable_file_exits_2() {
    let too_large = format!("{{\"triggers\": []}}{}", " ".repeat(MAX_FILE_BYTES));
    let cases: [(&[u8], &str); 5] = [
        (b"{\"triggers\": [],}", "not-json"),
        (b"{\"triggers\": []} // comment\n", "not-json"),
        (b"{\"triggers\": [], \"triggers\": []}", "duplicate-key"),
        (b"{\"triggers\": [\"\xff\"]}", "not-utf8"),
        (too_large.as_bytes(), "file-too-large"),
    ];
    for (bytes, code) in cases {
        let d = Deployment::new();
        std::fs::write(d.path().join("triggers.json"), bytes).unwrap();
        let run = d.run(&["triggers", "check", "--json"]);
        assert_eq!(run.code, 2, "{code}: {}{}", run.stdout, run.stderr);
        let report = json_of(&run.stdout);
        assert_eq!(report["valid"], false, "{code}");
        assert_eq!(report["code"], code);
        assert_eq!(report["triggers"], json!([]), "{code}");
        let errors = report["errors"].as_array().unwrap();
        assert_eq!(errors.len(), 1, "{code}");
        assert_eq!(errors[0]["path"], "", "{code}");
        let human = d.run(&["triggers", "check"]);
        assert_eq!(human.code, 2, "{code}");
        let line = format!(
            "✗ cannot be read: {} [{code}]\n",
            errors[0]["message"].as_str().unwrap()
        );
        assert!(
            human.stdout.contains(&line),
            "{line} not in:\n{}",
            human.stdout
        );
    }
}

#[test]
fn a_missing_file_or_a_link_is_unreadable() {
    let d = Deployment::new();
    let run = d.run(&["triggers", "check"]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    insta::assert_snapshot!("missing_human", d.redact(&run.stdout));
    let report = json_of(&d.run(&["triggers", "check", "--json"]).stdout);
    assert_eq!(report["code"], "file-missing");

    let target = d.write("elsewhere.json", VALID);
    std::os::unix::fs::symlink(target, d.path().join("triggers.json")).unwrap();
    let run = d.run(&["triggers", "check", "--json"]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    let report = json_of(&run.stdout);
    assert_eq!(report["valid"], false);
    assert_eq!(report["code"], "file-link");
    assert_eq!(d.run(&["triggers", "check"]).code, 2);

    // A folder where the file should be.
    let d = Deployment::new();
    std::fs::create_dir(d.path().join("triggers.json")).unwrap();
    let run = d.run(&["triggers", "check", "--json"]);
    assert_eq!(run.code, 2);
    assert_eq!(json_of(&run.stdout)["code"], "file-not-regular");
}

#[test]
fn misuse_exits_2() {
    let d = Deployment::new();
    d.write("triggers.json", VALID);
    assert_eq!(d.run(&["triggers", "check", "--nope"]).code, 2);
    assert_eq!(d.run(&["triggers", "check", "a.json", "b.json"]).code, 2);
    assert_eq!(d.run(&["triggers"]).code, 2);
    assert_eq!(d.run(&["triggers", "nope"]).code, 2);
    assert_eq!(d.run(&["triggers", "check", "--help"]).code, 0);
    assert_eq!(d.run(&["triggers", "check"]).code, 0);
}

#[test]
fn the_file_is_found_by_argument_environment_dotenv_or_default() {
    let d = Deployment::new();
    d.write("triggers.json", VALID);
    d.write("conf/dotenv.json", INVALID);
    d.write("env.json", "{\"triggers\": []}");
    d.write("arg/triggers.json", "not json");
    d.write("deploy/conf/triggers.json", "{\"triggers\": []}");

    let file_of = |run: crate::common::Run| -> (String, i32) {
        let file = json_of(&run.stdout)["file"].as_str().unwrap().to_owned();
        (file, run.code)
    };
    let base = d.path().display().to_string();

    // Default: triggers.json in the deployment folder.
    assert_eq!(
        file_of(d.run(&["triggers", "check", "--json"])),
        (format!("{base}/triggers.json"), 0)
    );
    // The .env's PI_TRIGGERS_FILE, relative to the deployment folder.
    d.write(".env", "# deployment\nPI_TRIGGERS_FILE=conf/dotenv.json\n");
    assert_eq!(
        file_of(d.run(&["triggers", "check", "--json"])),
        (format!("{base}/conf/dotenv.json"), 1)
    );
    // The environment wins over the .env, and may be absolute.
    let out = d
        .command(&["triggers", "check", "--json"])
        .env("PI_TRIGGERS_FILE", format!("{base}/env.json"))
        .output()
        .unwrap();
    assert_eq!(file_of(out.into()), (format!("{base}/env.json"), 0));
    // The argument wins over both, relative to the current folder.
    let out = d
        .command(&["triggers", "check", "--json", "arg/triggers.json"])
        .env("PI_TRIGGERS_FILE", format!("{base}/env.json"))
        .output()
        .unwrap();
    assert_eq!(
        file_of(out.into()),
        (format!("{base}/arg/triggers.json"), 2)
    );

    // With --dir, the setting is relative to the deployment folder, the argument to the current one.
    let out = d
        .command(&["triggers", "check", "--json", "--dir", "deploy"])
        .env("PI_TRIGGERS_FILE", "conf/triggers.json")
        .output()
        .unwrap();
    assert_eq!(
        file_of(out.into()),
        (format!("{base}/deploy/conf/triggers.json"), 0)
    );
    assert_eq!(
        file_of(d.run(&[
            "triggers",
            "check",
            "--json",
            "--dir",
            "deploy",
            "triggers.json"
        ])),
        (format!("{base}/triggers.json"), 0)
    );
    // Without a setting there, the default is the deployment folder's triggers.json.
    assert_eq!(
        file_of(d.run(&["triggers", "check", "--json", "--dir", "deploy"])),
        (format!("{base}/deploy/triggers.json"), 2)
    );
}

#[test]
fn a_broken_dotenv_is_reported_unless_the_file_is_given() {
    let d = Deployment::new();
    d.write("triggers.json", VALID);
    d.write(".env", "PI_TRIGGERS_FILE=x.json\nbroken line canary\n");
    let run = d.run(&["triggers", "check"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains(".env line 2"), "{}", run.stderr);
    assert!(!run.stderr.contains("canary"));
    assert_eq!(run.stdout, "");
    // Neither the argument nor the environment needs the .env.
    assert_eq!(d.run(&["triggers", "check", "triggers.json"]).code, 0);
    let out = d
        .command(&["triggers", "check"])
        .env("PI_TRIGGERS_FILE", "triggers.json")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
}

/// Canary values in every place a value can stand, valid and refused, and then a search of the
/// whole output of both formats.
#[test]
fn no_value_reaches_the_output() {
    let canaries = [
        "cnry-command-1a2b",
        "cnry-task-3c4d",
        "cnry-secret-5e6f",
        "cnry-label-7a8b",
        "cnry-phrase-9c0d",
        "cnry-model-1e2f",
        "cnry-folder-2f3a",
        "cnry-bad-command-4b5c",
        "cnry-bad-task-6d7e",
        "cnry-bad-secret-8f9a",
        "cnry-bad-label-0b1c",
        "cnry-bad-phrase-2d3e",
        "cnry-bad-model-4f5a",
    ];
    let valid = r#"{
      "triggers": [
        {
          "on": { "type": "label", "any": ["cnry-label-7a8b"], "none": ["other-cnry-label-7a8b"] },
          "run": {
            "kind": "github",
            "flow": "answer",
            "mcp": ["docs"],
            "secrets": { "DOCS_TOKEN": "op://ci/cnry-secret-5e6f/token" }
          }
        },
        {
          "on": { "type": "comment", "phrase": "/pi cnry-phrase-9c0d" },
          "run": {
            "kind": "gitlab",
            "command": "pi --go cnry-command-1a2b",
            "provider": "openai",
            "model": "cnry-model-1e2f",
            "models": ["openai/cnry-model-1e2f"]
          }
        },
        {
          "on": { "type": "cron", "id": "nightly", "pattern": "0 3 * * *" },
          "run": {
            "kind": "local",
            "command": "run cnry-command-1a2b",
            "folder": "/srv/cnry-folder-2f3a",
            "task": "Do it.\ncnry-task-3c4d"
          }
        }
      ]
    }"#;
    // The same triggers, and one more refused for (or despite) the values it holds.
    let refused = valid.replacen(
        "\n      ]\n",
        r#",
        {
          "on": { "type": "comment", "phrase": "/pi\ncnry-bad-phrase-2d3e" },
          "run": {
            "kind": "github",
            "command": "run\tcnry-bad-command-4b5c",
            "task": "cnry-bad-task-6d7e",
            "model": "cnry-bad-model-4f5a",
            "secrets": { "PATH": "cnry-bad-secret-8f9a", "TOKEN": "op://x\ncnry-bad-secret-8f9a" }
          }
        },
        {
          "on": { "type": "label", "any": ["cnry-bad-label-0b1c", "cnry-bad-label-0b1c"] },
          "run": { "kind": "github", "flow": "answer" }
        }
      ]
"#,
        1,
    );
    assert_ne!(refused, valid);
    for (text, code) in [(valid, 0), (refused.as_str(), 1)] {
        let d = Deployment::new();
        d.write("triggers.json", text);
        for args in [
            &["triggers", "check"][..],
            &["triggers", "check", "--json"][..],
        ] {
            let run = d.run(args);
            assert_eq!(run.code, code, "{args:?}: {}{}", run.stdout, run.stderr);
            for canary in canaries {
                assert!(
                    !run.stdout.contains(canary),
                    "{canary} in {args:?}:\n{}",
                    run.stdout
                );
                assert!(
                    !run.stderr.contains(canary),
                    "{canary} in {args:?}:\n{}",
                    run.stderr
                );
            }
        }
    }
    // The refused triggers were refused for those values, so the search above looked at real
    // messages.
    let d = Deployment::new();
    d.write("triggers.json", &refused);
    let report = json_of(&d.run(&["triggers", "check", "--json"]).stdout);
    let paths: Vec<&str> = report["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    for path in [
        "triggers[3].on.phrase",
        "triggers[3].run.command",
        "triggers[3].run.task",
        "triggers[3].run.model",
        "triggers[3].run.secrets.PATH",
        "triggers[3].run.secrets.TOKEN",
        "triggers[4].on.any[1]",
    ] {
        assert!(paths.contains(&path), "{path} not in {paths:?}");
    }
}

#[test]
fn a_key_written_twice_is_named() {
    let d = Deployment::new();
    d.write(
        "triggers.json",
        "{\"triggers\": [{\"on\": {\"type\": \"label\", \"any\": [\"a\"]},\n  \"run\": {\"kind\": \"github\", \"flow\": \"answer\", \"flow\": \"review\"}}]}",
    );
    let run = d.run(&["triggers", "check"]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    insta::assert_snapshot!("duplicate_key_human", d.redact(&run.stdout));
}

#[test]
fn a_server_the_overlay_does_not_offer_is_a_warning_per_trigger_and_name() {
    let d = Deployment::new();
    d.write(
        "triggers.json",
        r#"{"triggers": [
          {"on": {"type": "label", "any": ["a"]}, "run": {"kind": "github", "flow": "answer", "mcp": ["docs", "forge", "gone"]}},
          {"on": {"type": "label", "any": ["b"]}, "run": {"kind": "gitlab", "flow": "answer", "mcp": ["off", "bad"]}},
          {"on": {"type": "label", "any": ["c"]}, "run": {"kind": "github", "flow": "answer", "mcp": ["forge"]}}
        ]}"#,
    );
    d.write(
        "pi-global/mcp.json",
        r#"{"mcpServers": {
          "docs": {"url": "https://mcp.example.com/mcp", "description": "Docs"},
          "off": {"url": "https://off.example.com/mcp", "description": "Off", "enabled": false},
          "bad": {"url": "HTTPS://Bad.example.com/mcp", "description": "Bad"}
        }}"#,
    );
    let run = d.run(&["triggers", "check"]);
    assert_eq!(run.code, 0, "warnings keep the exit code: {}", run.stdout);
    insta::assert_snapshot!("unoffered_human", d.redact(&run.stdout));

    let run = d.run(&["triggers", "check", "--json"]);
    assert_eq!(run.code, 0);
    let report = json_of(&run.stdout);
    assert_eq!(report["valid"], true);
    let warnings = report["warnings"].as_array().unwrap();
    let paths: Vec<&str> = warnings
        .iter()
        .map(|w| w["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "triggers[0].run.mcp[2]",
            "triggers[1].run.mcp[0]",
            "triggers[1].run.mcp[1]"
        ]
    );
    assert!(
        warnings[0]["message"]
            .as_str()
            .unwrap()
            .contains("does not offer 'gone'"),
        "{warnings:?}"
    );

    // The overlay found through PI_GLOBAL_PI_DIR, as mcp check finds it: this one offers them all.
    d.write(
        "other/mcp.json",
        r#"{"mcpServers": {
          "docs": {"url": "https://mcp.example.com/mcp", "description": "Docs"},
          "gone": {"url": "https://gone.example.com/mcp", "description": "Gone"},
          "off": {"url": "https://off.example.com/mcp", "description": "Off"},
          "bad": {"url": "https://bad.example.com/mcp", "description": "Bad"}
        }}"#,
    );
    let out = d
        .command(&["triggers", "check", "--json"])
        .env("PI_GLOBAL_PI_DIR", d.path().join("other"))
        .output()
        .unwrap();
    let run: crate::common::Run = out.into();
    assert_eq!(run.code, 0);
    assert_eq!(json_of(&run.stdout)["warnings"], json!([]));
}

#[test]
fn an_overlay_that_cannot_be_read_is_said_once() {
    let d = Deployment::new();
    d.write("triggers.json", VALID);
    // No overlay at all: one warning, however many names.
    let run = d.run(&["triggers", "check"]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    let warnings: Vec<&str> = run.stdout.lines().filter(|l| l.starts_with('⚠')).collect();
    assert_eq!(warnings.len(), 1, "{}", run.stdout);
    assert!(
        d.redact(warnings[0]).starts_with(
            "⚠ the overlay's [DIR]/pi-global/mcp.json cannot be read (mcp.json not found [file-missing])"
        ),
        "{}",
        warnings[0]
    );
    assert!(
        run.stdout.ends_with("5 triggers: all valid; 1 warning\n"),
        "{}",
        run.stdout
    );
    // Not JSON.
    d.write("pi-global/mcp.json", "{,}");
    let report = json_of(&d.run(&["triggers", "check", "--json"]).stdout);
    let warnings = report["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0]["path"], "");
    assert!(
        warnings[0]["message"]
            .as_str()
            .unwrap()
            .contains("[not-json]"),
        "{warnings:?}"
    );
    // A setting that cannot be used: still a warning, and the exit code is the file's.
    let out = d
        .command(&["triggers", "check"])
        .env("PI_GLOBAL_PI_DIR", "relative")
        .output()
        .unwrap();
    let run: crate::common::Run = out.into();
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("⚠ the overlay folder cannot be told (PI_GLOBAL_PI_DIR"),
        "{}",
        run.stdout
    );
    // Triggers that name only forge, or no server, need no overlay and hear nothing of it.
    d.write(
        "triggers.json",
        r#"{"triggers": [{"on": {"type": "label", "any": ["a"]}, "run": {"kind": "github", "flow": "answer", "mcp": ["forge"]}}]}"#,
    );
    std::fs::remove_file(d.path().join("pi-global/mcp.json")).unwrap();
    let run = d.run(&["triggers", "check"]);
    assert!(!run.stdout.contains('⚠'), "{}", run.stdout);
}

/// A pattern of the right shape that names no time is refused by `triggers check`, as the worker
/// would refuse to schedule it, naming the field (never the value).
#[test]
fn a_cron_pattern_the_worker_could_not_schedule_is_refused() {
    let d = Deployment::new();
    for pattern in ["61 * * * *", "*/0 * * * *", "0 25 * * *", "1-70 * * * *"] {
        d.write(
            "triggers.json",
            &json!({"triggers": [{"on": {"type": "cron", "id": "nightly", "pattern": pattern},
                "run": {"kind": "local", "folder": "/srv/repo", "task": "Tidy up", "flow": "task"}}]})
            .to_string(),
        );
        let run = d.run(&["triggers", "check", "--json"]);
        assert_eq!(run.code, 1, "{pattern}: {}{}", run.stdout, run.stderr);
        let report = json_of(&run.stdout);
        assert_eq!(
            report["errors"][0]["path"], "triggers[0].on.pattern",
            "{report}"
        );
        assert!(!run.stdout.contains(pattern), "{}", run.stdout);
    }
}

/// Every command that reads the deployment's triggers file reads it the same way (one reader): a
/// file that is a link is refused by each, and each says so by the file's path once.
#[test]
fn every_command_reads_the_triggers_file_alike() {
    let d = Deployment::new();
    assert_eq!(d.run(&["init"]).code, 0);
    let real = d.write(
        "elsewhere/triggers.json",
        r#"{"triggers": [{"on": {"type": "cron", "id": "nightly", "pattern": "0 3 * * *"},
            "run": {"kind": "local", "folder": "/srv/repo", "task": "t", "flow": "task"}}]}"#,
    );
    let file = d.path().join("triggers.json");
    std::fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink(&real, &file).unwrap();
    let said = format!(
        "{} is a link; pi-dispatch does not follow links in configuration",
        file.display()
    );

    let check = d.run(&["triggers", "check"]);
    assert_eq!(check.code, 2, "{}", check.stdout);
    assert!(check.stdout.contains("is a link"), "{}", check.stdout);

    let explain = d.run(&["explain", "--trigger", "0"]);
    assert_eq!(explain.code, 2, "{}", explain.stdout);
    assert_eq!(
        explain.stderr.matches(&said).count(),
        1,
        "{}",
        explain.stderr
    );

    let run = d.run(&["run", "--trigger", "0"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert_eq!(run.stderr.matches(&said).count(), 1, "{}", run.stderr);

    // doctor used to pass over a triggers file it could not read; it fails it like the others.
    let doctor = d.run(&["doctor"]);
    assert!(
        doctor
            .stdout
            .lines()
            .any(|l| l.starts_with('✗') && l.contains(&said)),
        "{}",
        doctor.stdout
    );

    // The control: the same file, not linked, is read by each.
    std::fs::remove_file(&file).unwrap();
    std::fs::copy(&real, &file).unwrap();
    let check = d.run(&["triggers", "check"]);
    assert_eq!(check.code, 0, "{}", check.stdout);
    let explain = d.run(&["explain", "--trigger", "0"]);
    assert!(!explain.stderr.contains("is a link"), "{}", explain.stderr);
    assert!(!d.run(&["doctor"]).stdout.contains("is a link"));
}

/// A deployment without a triggers file has no trigger, and the commands that take one by its
/// index say that the file is not there.
#[test]
fn a_missing_triggers_file_has_no_trigger() {
    let d = Deployment::new();
    assert_eq!(d.run(&["init"]).code, 0);
    let file = d.path().join("triggers.json");
    std::fs::remove_file(&file).unwrap();
    let said = format!("{} does not exist, so it has no trigger 0", file.display());
    let explain = d.run(&["explain", "--trigger", "0"]);
    assert_eq!(explain.code, 2);
    assert!(explain.stderr.contains(&said), "{}", explain.stderr);
    let run = d.run(&["run", "--trigger", "0"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains(&said), "{}", run.stderr);
}
