//! `pi-dispatch mcp check` end to end: good, refused and unreadable files, both formats, where the
//! overlay is found, and that no value ever reaches the output.

use serde_json::Value;

use crate::common::Deployment;

const GOOD: &str = r#"{
  "mcpServers": {
    "docs": {
      "url": "https://mcp.example.com/mcp",
      "headers": { "Authorization": "Bearer ${DOCS_TOKEN}" },
      "description": "Search the product documentation",
      "exposure": "codemode"
    },
    "files": {
      "command": "/opt/pi-global/mcp/files-server",
      "args": ["--root", "/workspace"],
      "env": { "FILES_TOKEN": "${FILES_TOKEN}" },
      "description": "Index of the checkout's files",
      "exposure": "deferred"
    },
    "memory": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-memory"],
      "allowPackageRunner": true,
      "description": "Scratch memory"
    },
    "old": { "url": "https://old.example.com/mcp", "description": "Retired", "enabled": false }
  }
}"#;

const REFUSED: &str = r#"{
  "mcpServers": {
    "docs": { "url": "https://mcp.example.com/mcp", "description": "Docs" },
    "forge": { "command": "/usr/local/bin/forge-mcp-github", "description": "Mine" },
    "legacy": { "type": "sse", "url": "https://h.example.com/sse", "description": "Old transport" },
    "signin": { "url": "HTTPS://Sign.example.com:443/mcp", "description": "Sign in", "oauth": {} },
    "runner": { "command": "uvx", "args": ["mcp-server-time"], "description": "Time", "cwd": "/tmp" }
  }
}"#;

fn json_of(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

#[test]
fn a_good_file_passes() {
    let d = Deployment::new();
    d.write("pi-global/mcp.json", GOOD);
    let run = d.run(&["mcp", "check"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    insta::assert_snapshot!("good_human", d.redact(&run.stdout));

    let run = d.run(&["mcp", "check", "--json"]);
    assert_eq!(run.code, 0);
    let report = json_of(&run.stdout);
    assert_eq!(report["readable"], true);
    assert_eq!(report["problems"], serde_json::json!([]));
    let servers = report["servers"].as_array().unwrap();
    let names: Vec<&str> = servers
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["docs", "files", "memory", "old"]);
    assert_eq!(servers[0]["transport"], "http");
    assert_eq!(servers[1]["transport"], "stdio");
    assert_eq!(servers[2]["packageRunner"], "npx");
    assert_eq!(servers[3]["offered"], false);
    assert_eq!(servers[3]["enabled"], false);
    assert_eq!(servers[3]["problems"], serde_json::json!([]));
}

#[test]
fn the_json_report_has_the_documented_shape() {
    let d = Deployment::new();
    d.write("pi-global/mcp.json", REFUSED);
    let report = json_of(&d.run(&["mcp", "check", "--json"]).stdout);
    assert!(
        report["file"]
            .as_str()
            .unwrap()
            .ends_with("pi-global/mcp.json")
    );
    assert!(report["readable"].is_boolean());
    assert!(report["problems"].is_array());
    for server in report["servers"].as_array().unwrap() {
        assert!(server["name"].is_string());
        assert!(server["offered"].is_boolean());
        assert!(server["enabled"].is_boolean());
        assert!(["http", "stdio"].contains(&server["transport"].as_str().unwrap()));
        for p in server["problems"].as_array().unwrap() {
            assert!(p["code"].is_string() && p["field"].is_string() && p["message"].is_string());
        }
    }
}

#[test]
fn a_refused_server_exits_1_and_says_why() {
    let d = Deployment::new();
    d.write("pi-global/mcp.json", REFUSED);
    let run = d.run(&["mcp", "check"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    insta::assert_snapshot!("refused_human", d.redact(&run.stdout));

    let run = d.run(&["mcp", "check", "--json"]);
    assert_eq!(run.code, 1);
    let report = json_of(&run.stdout);
    let codes_of = |name: &str| -> Vec<String> {
        report["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap()["problems"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["code"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(codes_of("docs").is_empty());
    assert_eq!(codes_of("forge"), ["name-reserved"]);
    assert_eq!(codes_of("legacy"), ["type-sse"]);
    assert_eq!(codes_of("signin"), ["key-auth", "url-not-plain"]);
    assert_eq!(codes_of("runner"), ["key-cwd", "package-runner"]);
    let plain = report["servers"][3]["problems"][1]["message"]
        .as_str()
        .unwrap();
    assert!(plain.contains("https://sign.example.com/mcp"), "{plain}");
}

#[test]
fn an_unreadable_file_exits_2() {
    for (text, code) in [
        ("{\"mcpServers\": {},}", "not-json"),
        ("{\"mcpServers\": {} // comment\n}", "not-json"),
        (
            "{\"mcpServers\": {\"a\": {\"url\": \"https://h/mcp\", \"url\": \"https://i/mcp\"}}}",
            "duplicate-key",
        ),
        ("{\"servers\": {}}", "top-level-invalid"),
        ("{\"mcpServers\": []}", "top-level-invalid"),
    ] {
        let d = Deployment::new();
        d.write("pi-global/mcp.json", text);
        let run = d.run(&["mcp", "check", "--json"]);
        assert_eq!(run.code, 2, "{text}");
        let report = json_of(&run.stdout);
        assert_eq!(report["readable"], false, "{text}");
        assert_eq!(report["problems"][0]["code"], code, "{text}");
        assert_eq!(report["servers"], serde_json::json!([]));
        let human = d.run(&["mcp", "check"]);
        assert_eq!(human.code, 2);
        assert!(
            human.stdout.contains(&format!("[{code}]")),
            "{}",
            human.stdout
        );
    }
}

#[test]
fn a_missing_file_or_a_link_is_unreadable() {
    let d = Deployment::new();
    std::fs::create_dir(d.path().join("pi-global")).unwrap();
    let run = d.run(&["mcp", "check"]);
    assert_eq!(run.code, 2);
    insta::assert_snapshot!("missing_human", d.redact(&run.stdout));

    let target = d.write("elsewhere.json", GOOD);
    std::os::unix::fs::symlink(target, d.path().join("pi-global/mcp.json")).unwrap();
    let report = json_of(&d.run(&["mcp", "check", "--json"]).stdout);
    assert_eq!(report["readable"], false);
    assert_eq!(report["problems"][0]["code"], "file-link");
}

#[test]
fn misuse_exits_2() {
    let d = Deployment::new();
    assert_eq!(d.run(&["mcp", "check", "--nope"]).code, 2);
    assert_eq!(d.run(&["mcp", "check", "extra"]).code, 2);
    assert_eq!(d.run(&["mcp", "check", "--overlay"]).code, 2);
    assert_eq!(d.run(&["mcp"]).code, 2);
    assert_eq!(d.run(&["mcp", "check", "--help"]).code, 0);
}

#[test]
fn the_overlay_is_found_by_flag_environment_dotenv_or_default() {
    let d = Deployment::new();
    d.write("pi-global/mcp.json", GOOD);
    d.write("flag/mcp.json", REFUSED);
    d.write("env/mcp.json", "{\"mcpServers\": {}}");
    d.write("dotenv/mcp.json", "not json");

    let file_of = |run: crate::common::Run| -> String {
        json_of(&run.stdout)["file"].as_str().unwrap().to_owned()
    };
    let base = d.path().display().to_string();

    // Default: ./pi-global.
    assert_eq!(
        file_of(d.run(&["mcp", "check", "--json"])),
        format!("{base}/pi-global/mcp.json")
    );
    // The .env in the current folder.
    d.write(
        ".env",
        &format!("# deployment\nPI_GLOBAL_PI_DIR={base}/dotenv\n"),
    );
    assert_eq!(
        file_of(d.run(&["mcp", "check", "--json"])),
        format!("{base}/dotenv/mcp.json")
    );
    // The environment wins over the .env.
    let out = d
        .command(&["mcp", "check", "--json"])
        .env("PI_GLOBAL_PI_DIR", format!("{base}/env"))
        .output()
        .unwrap();
    assert_eq!(file_of(out.into()), format!("{base}/env/mcp.json"));
    // The flag wins over both, and may be relative.
    assert_eq!(
        file_of(d.run(&["mcp", "check", "--json", "--overlay", "flag"])),
        format!("{base}/flag/mcp.json")
    );
}

#[test]
fn a_bad_setting_is_named_and_exits_2() {
    let d = Deployment::new();
    let out = d
        .command(&["mcp", "check"])
        .env("PI_GLOBAL_PI_DIR", "relative/canary-dir")
        .output()
        .unwrap();
    let run: crate::common::Run = out.into();
    assert_eq!(run.code, 2);
    assert!(
        run.stderr
            .contains("PI_GLOBAL_PI_DIR must be an absolute path"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("canary"));

    d.write(".env", "PI_GLOBAL_PI_DIR=/x\nbroken line canary\n");
    let run = d.run(&["mcp", "check"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains(".env line 2"), "{}", run.stderr);
    assert!(!run.stderr.contains("canary"));
}

/// Canary values in every place a value can stand, valid and refused, and then a search of the
/// whole output of both formats.
#[test]
fn no_value_reaches_the_output() {
    let canaries = [
        "cnry-hdr-valid",
        "cnry-hdr-literal",
        "cnry-env-literal",
        "cnry-query-literal",
        "cnry-arg-1",
        "cnry-arg-2",
        "cnry-arg-3",
        "cnry-user",
        "cnry-pass",
        "cnry-frag",
        "cnry-bang",
        "cnry-bare-query",
    ];
    let text = r#"{
      "mcpServers": {
        "ok": {
          "url": "https://h.example.com/mcp?api_key=${KEY}",
          "headers": { "Authorization": "Bearer ${TOKEN}" },
          "description": "valid"
        },
        "hdr": {
          "url": "https://h.example.com/mcp",
          "headers": { "Authorization": "Bearer cnry-hdr-literal", "X-Other": "!op read cnry-bang" },
          "description": "literal header"
        },
        "envs": {
          "command": "node",
          "args": ["--token=cnry-arg-1", "~/cnry-arg-2", "${cnry-arg-3}"],
          "env": { "TOKEN": "cnry-env-literal" },
          "description": "literal env"
        },
        "query": {
          "url": "HTTPS://H.example.com:443/mcp?api_key=cnry-query-literal",
          "description": "literal query"
        },
        "bare": { "url": "https://h.example.com/mcp?cnry-bare-query", "description": "bare query" },
        "creds": {
          "url": "https://cnry-user:cnry-pass@h.example.com/mcp#cnry-frag",
          "description": "credentials"
        }
      }
    }"#;
    let d = Deployment::new();
    d.write("pi-global/mcp.json", text);
    for args in [&["mcp", "check"][..], &["mcp", "check", "--json"][..]] {
        let run = d.run(args);
        assert_eq!(run.code, 1, "{}", run.stdout);
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
    // The entries were refused for those values, so the search above looked at real messages.
    let report = json_of(&d.run(&["mcp", "check", "--json"]).stdout);
    let refused: Vec<&str> = report["servers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !s["problems"].as_array().unwrap().is_empty())
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(refused, ["hdr", "envs", "query", "bare", "creds"]);
}

#[test]
fn a_reader_that_goes_away_does_not_crash_the_check() {
    // Far more output than a pipe holds, so the check is still writing when the reader leaves.
    let servers: Vec<String> = (0..3000)
        .map(|i| {
            format!(r#""s{i}": {{"url": "https://h{i}.example.com/mcp", "description": "d"}}"#)
        })
        .collect();
    let d = Deployment::new();
    d.write(
        "pi-global/mcp.json",
        &format!(r#"{{"mcpServers": {{{}}}}}"#, servers.join(",")),
    );
    for args in [&["mcp", "check", "--json"][..], &["mcp", "check"][..]] {
        let mut child = d
            .command(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn a_broken_dotenv_does_not_matter_when_the_environment_decides() {
    let d = Deployment::new();
    d.write("elsewhere/mcp.json", GOOD);
    d.write(".env", "this is not a setting\n");
    let out = d
        .command(&["mcp", "check"])
        .env("PI_GLOBAL_PI_DIR", d.path().join("elsewhere"))
        .output()
        .unwrap();
    let run: crate::common::Run = out.into();
    assert_eq!(run.code, 0, "{}", run.stderr);
    // Without the environment, the .env is needed and its error is reported.
    assert_eq!(d.run(&["mcp", "check"]).code, 2);
}

#[test]
fn a_key_written_twice_is_named_and_escaped_when_not_printable() {
    let d = Deployment::new();
    d.write(
        "pi-global/mcp.json",
        "{\"mcpServers\": {\"a\": {\"url\": \"https://h/mcp\",\n  \"url\": \"https://i/mcp\"}}}",
    );
    let run = d.run(&["mcp", "check"]);
    assert_eq!(run.code, 2);
    insta::assert_snapshot!("duplicate_key_human", d.redact(&run.stdout));

    // A key with a control character is shown escaped, never raw.
    d.write(
        "pi-global/mcp.json",
        r#"{"mcpServers": {}, "x\u001b[2J": 1, "x\u001b[2J": 2}"#,
    );
    let run = d.run(&["mcp", "check", "--json"]);
    assert_eq!(run.code, 2);
    let message = json_of(&run.stdout)["problems"][0]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains(r"the key 'x\u{1b}[2J' is written twice"),
        "{message}"
    );
    let human = d.run(&["mcp", "check"]).stdout;
    assert!(!human.contains('\u{1b}'), "{human:?}");
    assert!(human.contains(r"'x\u{1b}[2J'"), "{human}");
}

#[test]
fn an_http_server_sending_a_credential_header_passes_with_a_warning() {
    let d = Deployment::new();
    d.write(
        "pi-global/mcp.json",
        r#"{"mcpServers": {
          "intranet": {"url": "http://wiki.corp.example:8080/mcp", "headers": {"Authorization": "Bearer ${WIKI_TOKEN}"}, "description": "Wiki"},
          "local": {"url": "http://localhost:3000/mcp", "headers": {"X-Api-Key": "${LOCAL_KEY}"}, "description": "Local"},
          "open": {"url": "http://open.example.com:8080/mcp", "description": "No credential"}
        }}"#,
    );
    let run = d.run(&["mcp", "check"]);
    assert_eq!(run.code, 0, "a warning keeps the exit code: {}", run.stdout);
    insta::assert_snapshot!("plain_http_human", d.redact(&run.stdout));

    let run = d.run(&["mcp", "check", "--json"]);
    assert_eq!(run.code, 0);
    let report = json_of(&run.stdout);
    let servers = report["servers"].as_array().unwrap();
    for (server, place) in [
        (
            &servers[0],
            "across the network to wiki.corp.example port 8080",
        ),
        (&servers[1], "to localhost port 3000, the loopback"),
    ] {
        assert_eq!(server["offered"], true, "{server}");
        assert_eq!(server["problems"], serde_json::json!([]), "{server}");
        let warnings = server["warnings"].as_array().unwrap();
        assert_eq!(warnings.len(), 1, "{server}");
        let w = &warnings[0];
        assert_eq!(w["code"], "plain-http-credentials");
        assert_eq!(w["field"], "url");
        assert!(w["message"].as_str().unwrap().contains(place), "{w}");
        assert!(w["fix"].as_str().unwrap().contains("https://"), "{w}");
    }
    assert_eq!(servers[2]["warnings"], serde_json::json!([]));
}
