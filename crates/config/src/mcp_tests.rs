//! One test (at least) per rule of the overlay's server entries.

use crate::json;
use crate::mcp::*;
use crate::problem::ProblemCode as Code;

const HTTP: &str = r#""url": "https://mcp.example.com/mcp", "description": "Docs""#;
const STDIO: &str = r#""command": "/opt/pi-global/mcp/files", "description": "Files""#;

fn entry_named(name: &str, body: &str) -> ServerEntry {
    let value = json::parse(&format!("{{{body}}}")).unwrap();
    validate_entry(name, &value)
}

fn entry(body: &str) -> ServerEntry {
    entry_named("s", body)
}

fn valid(body: &str) -> McpServer {
    match entry(body).verdict {
        Ok(s) => s,
        Err(p) => panic!("{body}: {p:?}"),
    }
}

/// The codes of the entry's problems; panics when it is valid.
fn codes(body: &str) -> Vec<Code> {
    codes_named("s", body)
}

fn codes_named(name: &str, body: &str) -> Vec<Code> {
    match entry_named(name, body).verdict {
        Ok(_) => panic!("{name}: {body} was accepted"),
        Err(p) => p.into_iter().map(|p| p.code).collect(),
    }
}

fn refused_with(body: &str, code: Code) {
    let got = codes(body);
    assert!(got.contains(&code), "{body}: wanted {code}, got {got:?}");
}

#[test]
fn names_are_lowercase_words_joined_by_single_dashes() {
    for ok in [
        "docs",
        "a",
        "files-2",
        "my-docs-server",
        "x1-y2",
        &"a".repeat(32),
    ] {
        assert!(entry_named(ok, HTTP).verdict.is_ok(), "{ok}");
    }
    for bad in [
        "",
        "Docs",
        "my_docs",
        "my--docs",
        "-docs",
        "docs-",
        "my docs",
        "döcs",
        "docs.1",
        &"a".repeat(33),
    ] {
        assert_eq!(codes_named(bad, HTTP), [Code::NameInvalid], "{bad:?}");
    }
}

#[test]
fn forge_and_names_holding_dispatch_are_reserved() {
    for reserved in [
        "forge",
        "dispatch",
        "pi-dispatch",
        "dispatcher",
        "mydispatch2",
    ] {
        assert_eq!(
            codes_named(reserved, HTTP),
            [Code::NameReserved],
            "{reserved}"
        );
    }
    // Only the name forge itself is the forge's.
    assert!(entry_named("forge-docs", HTTP).verdict.is_ok());
    assert!(entry_named("forger", HTTP).verdict.is_ok());
}

#[test]
fn a_description_is_required_and_is_one_clean_line() {
    refused_with(r#""url": "https://h/mcp""#, Code::DescriptionMissing);
    refused_with(
        r#""url": "https://h/mcp", "description": """#,
        Code::DescriptionMissing,
    );
    refused_with(
        r#""url": "https://h/mcp", "description": "   ""#,
        Code::DescriptionMissing,
    );
    refused_with(
        r#""url": "https://h/mcp", "description": 5"#,
        Code::DescriptionInvalid,
    );
    refused_with(
        r#""url": "https://h/mcp", "description": null"#,
        Code::DescriptionInvalid,
    );
    for bad in [
        "two\\nlines",
        "tab\\there",
        "cr\\r",
        "nul\\u0000",
        "del\\u007f",
        "nel\\u0085",
        "zero\\u200bwidth",
        "rtl\\u202eoverride",
        "bom\\ufeff",
        "soft\\u00adhyphen",
        "tag\\udb40\\udc41",
        "line\\u2028sep",
        "para\\u2029sep",
        // Invisible, though not Cc or Cf: Unicode's Default_Ignorable_Code_Point set.
        "vs1\\ufe00",
        "vs16\\ufe0f",
        "vs17\\udb40\\udd00",
        "vs256\\udb40\\uddef",
        "choseong\\u115ffiller",
        "jungseong\\u1160filler",
        "hangul\\u3164filler",
        "halfwidth\\uffa0filler",
        "cgj\\u034fjoiner",
        "khmer\\u17b4inherent",
        "mongolian\\u180bfvs1",
        "mongolian\\u180ffvs4",
        "unassigned\\u2065ignorable",
        "unassigned\\ufff0ignorable",
        "unassigned\\udb43\\udfffplane14",
    ] {
        let body = format!(r#""url": "https://h/mcp", "description": "{bad}""#);
        assert_eq!(codes(&body), [Code::DescriptionInvalid], "{bad}");
    }
}

#[test]
fn a_description_counts_characters_not_bytes() {
    let at_limit = "é".repeat(300);
    let s = valid(&format!(
        r#""url": "https://h/mcp", "description": "{at_limit}""#
    ));
    assert_eq!(s.description.chars().count(), 300);
    let over = "a".repeat(301);
    refused_with(
        &format!(r#""url": "https://h/mcp", "description": "{over}""#),
        Code::DescriptionInvalid,
    );
    // Ordinary non-ASCII text, emoji and inner spaces are fine.
    valid(r#""url": "https://h/mcp", "description": "Suche in der Doku — 文档 🔎  ok""#);
}

#[test]
fn an_entry_is_http_or_stdio_and_type_must_agree() {
    assert_eq!(valid(HTTP).kind(), TransportKind::Http);
    assert_eq!(valid(STDIO).kind(), TransportKind::Stdio);
    for t in ["http", "streamable-http"] {
        assert_eq!(
            valid(&format!(r#"{HTTP}, "type": "{t}""#)).kind(),
            TransportKind::Http
        );
    }
    assert_eq!(
        valid(&format!(r#"{STDIO}, "type": "stdio""#)).kind(),
        TransportKind::Stdio
    );

    refused_with(r#""description": "d""#, Code::TransportMissing);
    refused_with(
        r#""description": "d", "type": "http""#,
        Code::TransportMissing,
    );
    refused_with(
        r#""description": "d", "type": "stdio""#,
        Code::TransportMissing,
    );
    refused_with(
        r#""url": "https://h/mcp", "command": "node", "description": "d""#,
        Code::TransportConflict,
    );
    refused_with(&format!(r#"{HTTP}, "type": "stdio""#), Code::TypeMismatch);
    refused_with(&format!(r#"{STDIO}, "type": "http""#), Code::TypeMismatch);
    refused_with(
        &format!(r#"{STDIO}, "type": "streamable-http""#),
        Code::TypeMismatch,
    );
}

#[test]
fn sse_and_other_types_are_refused() {
    assert_eq!(codes(&format!(r#"{HTTP}, "type": "sse""#)), [Code::TypeSse]);
    for t in [
        r#""websocket""#,
        r#""HTTP""#,
        r#""Stdio""#,
        "1",
        "null",
        "[]",
    ] {
        assert_eq!(
            codes(&format!(r#"{HTTP}, "type": {t}"#)),
            [Code::TypeInvalid],
            "{t}"
        );
    }
}

#[test]
fn keys_of_the_other_transport_are_refused() {
    for key in [
        r#""args": []"#,
        r#""env": {}"#,
        r#""allowPackageRunner": true"#,
    ] {
        assert_eq!(
            codes(&format!("{HTTP}, {key}")),
            [Code::KeyOtherTransport],
            "{key}"
        );
    }
    assert_eq!(
        codes(&format!(r#"{STDIO}, "headers": {{}}"#)),
        [Code::KeyOtherTransport]
    );
}

#[test]
fn auth_oauth_cwd_and_unknown_keys_are_refused() {
    assert_eq!(
        codes(&format!(r#"{HTTP}, "auth": "oauth""#)),
        [Code::KeyAuth]
    );
    assert_eq!(codes(&format!(r#"{HTTP}, "oauth": {{}}"#)), [Code::KeyAuth]);
    assert_eq!(
        codes(&format!(r#"{STDIO}, "cwd": "/workspace""#)),
        [Code::KeyCwd]
    );
    for key in [
        "disabled",
        "Description",
        "autoEnableCodemode",
        "lifecycle",
        "a b",
    ] {
        let got = entry(&format!(r#"{HTTP}, "{key}": true"#));
        let problems = got.problems();
        assert_eq!(problems.len(), 1, "{key}");
        assert_eq!(problems[0].code, Code::KeyUnknown);
    }
    // The field names the key when it is plain, and stays silent when it is not.
    let p = entry(&format!(r#"{HTTP}, "lifecycle": 1"#)).problems()[0].clone();
    assert_eq!(p.field, "lifecycle");
    let p = entry(&format!(r#"{HTTP}, "sk-canary value": 1"#)).problems()[0].clone();
    assert_eq!(p.field, "");
    assert!(!p.message.contains("canary"));
}

#[test]
fn header_values_are_references_with_an_optional_scheme() {
    let s = valid(
        r#""url": "https://h/mcp", "description": "d", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}", "X-Api-Key": "${KEY}"}"#,
    );
    let Transport::Http(h) = &s.transport else {
        panic!()
    };
    assert_eq!(h.headers[0].scheme, Some(AuthScheme::Bearer));
    assert_eq!(h.headers[0].value.name().as_str(), "DOCS_TOKEN");
    assert_eq!(h.headers[1].scheme, None);

    for scheme in AuthScheme::ALL {
        let body = format!(
            r#"{HTTP}, "headers": {{"Authorization": "{} ${{T}}"}}"#,
            scheme.as_str()
        );
        valid(&body);
    }
    for bad in [
        "Bearer abc",
        "bearer ${T}",
        "BEARER ${T}",
        "Bearer  ${T}",
        "Bearer\\t${T}",
        "Bearer ${T} ",
        " ${T}",
        "Custom ${T}",
        "Bearer ${T}x",
        "Bearer",
        "$T",
        "!op read op://x",
        "plain-constant",
        "",
        "${lower}",
    ] {
        let body = format!(r#"{HTTP}, "headers": {{"Authorization": "{bad}"}}"#);
        assert_eq!(codes(&body), [Code::HeaderLiteral], "{bad:?}");
    }
}

#[test]
fn header_names_must_be_tokens_unreserved_and_once() {
    refused_with(
        &format!(r#"{HTTP}, "headers": {{"Bad Name": "${{T}}"}}"#),
        Code::HeaderInvalid,
    );
    refused_with(
        &format!(r#"{HTTP}, "headers": {{"": "${{T}}"}}"#),
        Code::HeaderInvalid,
    );
    for reserved in [
        "Host",
        "content-length",
        "Proxy-Authorization",
        "Mcp-Session-Id",
    ] {
        let body = format!(r#"{HTTP}, "headers": {{"{reserved}": "${{T}}"}}"#);
        assert_eq!(codes(&body), [Code::HeaderReserved], "{reserved}");
    }
    refused_with(
        &format!(r#"{HTTP}, "headers": {{"X-Key": "${{A}}", "x-key": "${{B}}"}}"#),
        Code::HeaderInvalid,
    );
    refused_with(
        &format!(r#"{HTTP}, "headers": {{"X-Key": 5}}"#),
        Code::HeaderInvalid,
    );
    refused_with(&format!(r#"{HTTP}, "headers": []"#), Code::HeaderInvalid);
}

#[test]
fn literal_hints_explain_bang_and_bare_dollar_without_quoting() {
    let p =
        entry(&format!(r#"{HTTP}, "headers": {{"X": "!op read canary"}}"#)).problems()[0].clone();
    assert!(p.message.contains("'!'"), "{}", p.message);
    assert!(!p.message.contains("canary"));
    let p = entry(&format!(r#"{STDIO}, "env": {{"X": "$CANARY"}}"#)).problems()[0].clone();
    assert!(p.message.contains("braces"), "{}", p.message);
    assert!(!p.message.contains("CANARY"));
    let p =
        entry(&format!(r#"{HTTP}, "headers": {{"X": "Bearer $CANARY"}}"#)).problems()[0].clone();
    assert!(p.message.contains("braces"), "{}", p.message);
    assert!(!p.message.contains("CANARY"));
}

#[test]
fn env_values_are_exactly_one_reference() {
    let s = valid(&format!(
        r#"{STDIO}, "env": {{"FILES_TOKEN": "${{FILES_TOKEN}}", "PATH": "${{P}}"}}"#
    ));
    let Transport::Stdio(st) = &s.transport else {
        panic!()
    };
    assert_eq!(st.env.len(), 2);
    for bad in ["x${T}", "${T}x", "literal", "", "Bearer ${T}", "$T", "!cmd"] {
        let body = format!(r#"{STDIO}, "env": {{"X": "{bad}"}}"#);
        assert_eq!(codes(&body), [Code::EnvLiteral], "{bad:?}");
    }
    refused_with(&format!(r#"{STDIO}, "env": {{"X": 1}}"#), Code::EnvInvalid);
    refused_with(
        &format!(r#"{STDIO}, "env": {{"1X": "${{T}}"}}"#),
        Code::EnvInvalid,
    );
    refused_with(
        &format!(r#"{STDIO}, "env": {{"A-B": "${{T}}"}}"#),
        Code::EnvInvalid,
    );
    refused_with(&format!(r#"{STDIO}, "env": []"#), Code::EnvInvalid);
}

#[test]
fn env_may_not_replace_the_usage_meter() {
    for var in METER_VARIABLES {
        let body = format!(r#"{STDIO}, "env": {{"{var}": "${{X}}"}}"#);
        assert_eq!(codes(&body), [Code::EnvReserved], "{var}");
    }
}

#[test]
fn urls_are_plain_and_hold_references_only_in_path_and_query() {
    let s = valid(r#""url": "https://h/mcp/${ZAP_KEY}/sse?api_key=${KEY}", "description": "d""#);
    let names: Vec<&str> = s.references().into_iter().map(|n| n.as_str()).collect();
    assert_eq!(names, ["KEY", "ZAP_KEY"]);
    refused_with(
        r#""url": "HTTPS://h/mcp", "description": "d""#,
        Code::UrlNotPlain,
    );
    refused_with(
        r#""url": "https://h:443/mcp", "description": "d""#,
        Code::UrlNotPlain,
    );
    refused_with(
        r#""url": "https://${H}/mcp", "description": "d""#,
        Code::UrlHostReference,
    );
    refused_with(
        r#""url": "https://h/mcp?k=v", "description": "d""#,
        Code::UrlQueryLiteral,
    );
    refused_with(
        r#""url": "https://u:p@h/mcp", "description": "d""#,
        Code::UrlCredentials,
    );
    refused_with(
        r#""url": "https://h/mcp#x", "description": "d""#,
        Code::UrlFragment,
    );
    refused_with(
        r#""url": "ftp://h/mcp", "description": "d""#,
        Code::UrlScheme,
    );
    refused_with(
        r#""url": "https://h/${x}", "description": "d""#,
        Code::ReferenceMalformed,
    );
    refused_with(r#""url": 5, "description": "d""#, Code::UrlInvalid);
    let p = entry(r#""url": "https://H/mcp", "description": "d""#).problems()[0].clone();
    assert_eq!(p.field, "url");
    assert!(p.message.contains("https://h/mcp"), "{}", p.message);
}

#[test]
fn commands_are_bare_names_or_paths_under_the_image_folders() {
    for ok in [
        "node",
        "python3",
        "files-server",
        "/usr/bin/node",
        "/usr/local/bin/x",
        "/bin/x",
        "/sbin/x",
        "/opt/pi-global/mcp/files-server",
        "/app/server",
    ] {
        let s = valid(&format!(r#""command": "{ok}", "description": "d""#));
        let Transport::Stdio(st) = &s.transport else {
            panic!()
        };
        assert_eq!(st.command.as_str(), ok);
    }
    for (bad, code) in [
        ("/usr", Code::CommandPath),
        ("/usr/", Code::CommandPath),
        ("/usrx/bin/x", Code::CommandPath),
        ("/usr2/x", Code::CommandPath),
        ("/optional/x", Code::CommandPath),
        ("/tmp/x", Code::CommandPath),
        ("/workspace/server", Code::CommandPath),
        ("/home/u/x", Code::CommandPath),
        ("/root/x", Code::CommandPath),
        ("./server", Code::CommandPath),
        ("bin/server", Code::CommandPath),
        ("/usr/../tmp/x", Code::CommandPath),
        ("/opt/./x", Code::CommandPath),
        ("/usr//bin/x", Code::CommandPath),
        ("/opt/x/", Code::CommandPath),
        ("~/bin/server", Code::CommandHome),
        ("~server", Code::CommandHome),
        ("node server.js", Code::CommandInvalid),
        ("${CMD}", Code::CommandInvalid),
        ("", Code::CommandInvalid),
    ] {
        let body = format!(r#""command": "{bad}", "description": "d""#);
        assert_eq!(codes(&body), [code], "{bad:?}");
    }
    refused_with(
        r#""command": ["node"], "description": "d""#,
        Code::CommandInvalid,
    );
}

#[test]
fn arguments_may_hold_references_but_not_start_with_a_tilde() {
    let s = valid(&format!(
        r#"{STDIO}, "args": ["--root", "/workspace", "--token=${{TOKEN}}", "--header", "Authorization: Bearer ${{T2}}", "a~b", "--max-tokens", "4096"]"#
    ));
    let names: Vec<&str> = s.references().into_iter().map(|n| n.as_str()).collect();
    assert_eq!(names, ["T2", "TOKEN"]);
    assert_eq!(
        codes(&format!(r#"{STDIO}, "args": ["~/data"]"#)),
        [Code::ArgumentHome]
    );
    assert_eq!(
        codes(&format!(r#"{STDIO}, "args": ["~"]"#)),
        [Code::ArgumentHome]
    );
    let p = entry(&format!(r#"{STDIO}, "args": ["ok", "~/x"]"#)).problems()[0].clone();
    assert_eq!(p.field, "args[1]");
    refused_with(
        &format!(r#"{STDIO}, "args": ["--t=${{bad}}"]"#),
        Code::ReferenceMalformed,
    );
    refused_with(
        &format!(r#"{STDIO}, "args": [4096]"#),
        Code::ArgumentInvalid,
    );
    refused_with(&format!(r#"{STDIO}, "args": "--x""#), Code::ArgumentInvalid);
}

#[test]
fn package_runners_need_allow_package_runner() {
    for runner in PACKAGE_RUNNERS {
        let body = format!(r#""command": "{runner}", "description": "d""#);
        assert_eq!(codes(&body), [Code::PackageRunner], "{runner}");
        let allowed = valid(&format!(r#"{body}, "allowPackageRunner": true"#));
        assert!(allowed.allow_package_runner);
        assert_eq!(allowed.package_runner(), Some(runner));
        refused_with(
            &format!(r#"{body}, "allowPackageRunner": false"#),
            Code::PackageRunner,
        );
    }
    // By file name, also as an absolute path.
    refused_with(
        r#""command": "/usr/bin/npx", "description": "d""#,
        Code::PackageRunner,
    );
    refused_with(
        r#""command": "/usr/local/bin/uvx", "description": "d""#,
        Code::PackageRunner,
    );
    // Only those names.
    assert_eq!(
        valid(r#""command": "npx-server", "description": "d""#).package_runner(),
        None
    );
    assert_eq!(
        valid(r#""command": "/opt/npm/bin/server", "description": "d""#).package_runner(),
        None
    );
    refused_with(
        &format!(r#"{STDIO}, "allowPackageRunner": "yes""#),
        Code::AllowPackageRunnerInvalid,
    );
}

#[test]
fn exposures_are_the_four_pi_knows() {
    for e in Exposure::ALL {
        let s = valid(&format!(r#"{HTTP}, "exposure": "{}""#, e.as_str()));
        assert_eq!(s.exposure, Some(e));
    }
    for bad in [r#""Direct""#, r#""all""#, "1", "null"] {
        assert_eq!(
            codes(&format!(r#"{HTTP}, "exposure": {bad}"#)),
            [Code::ExposureInvalid]
        );
    }
    let s = valid(&format!(
        r#"{HTTP}, "toolExposure": {{"search": "direct", "admin_*": "hidden"}}"#
    ));
    assert_eq!(
        s.tool_exposure,
        [
            ("search".to_owned(), Exposure::Direct),
            ("admin_*".to_owned(), Exposure::Hidden)
        ]
    );
    refused_with(
        &format!(r#"{HTTP}, "toolExposure": {{"search": "all"}}"#),
        Code::ToolExposureInvalid,
    );
    refused_with(
        &format!(r#"{HTTP}, "toolExposure": {{"": "direct"}}"#),
        Code::ToolExposureInvalid,
    );
    refused_with(
        &format!(r#"{HTTP}, "toolExposure": {{"a b": "direct"}}"#),
        Code::ToolExposureInvalid,
    );
    refused_with(
        &format!(r#"{HTTP}, "toolExposure": "direct""#),
        Code::ToolExposureInvalid,
    );
}

#[test]
fn timeout_is_a_whole_number_from_1_to_600() {
    assert_eq!(valid(&format!(r#"{HTTP}, "timeout": 1"#)).timeout, Some(1));
    assert_eq!(
        valid(&format!(r#"{HTTP}, "timeout": 600"#)).timeout,
        Some(600)
    );
    assert_eq!(valid(HTTP).timeout, None);
    for bad in [
        "0", "601", "-1", "30.5", "30.0", "1e2", r#""30""#, "null", "true",
    ] {
        assert_eq!(
            codes(&format!(r#"{HTTP}, "timeout": {bad}"#)),
            [Code::TimeoutInvalid],
            "{bad}"
        );
    }
}

#[test]
fn a_turned_off_server_is_valid_but_not_offered() {
    let e = entry(&format!(r#"{HTTP}, "enabled": false"#));
    assert!(e.verdict.is_ok());
    assert!(!e.enabled);
    assert!(e.offered().is_none());
    assert!(
        entry(&format!(r#"{HTTP}, "enabled": true"#))
            .offered()
            .is_some()
    );
    assert!(entry(HTTP).offered().is_some());
    assert_eq!(
        codes(&format!(r#"{HTTP}, "enabled": "false""#)),
        [Code::EnabledInvalid]
    );
    assert_eq!(
        codes(&format!(r#"{HTTP}, "enabled": 0"#)),
        [Code::EnabledInvalid]
    );
}

#[test]
fn every_problem_of_an_entry_is_reported() {
    let got = codes_named(
        "Bad_Name",
        r#""url": "HTTPS://h/mcp", "headers": {"A": "lit"}, "timeout": 0, "cwd": "/", "exposure": "x""#,
    );
    for code in [
        Code::NameInvalid,
        Code::DescriptionMissing,
        Code::UrlNotPlain,
        Code::HeaderLiteral,
        Code::TimeoutInvalid,
        Code::KeyCwd,
        Code::ExposureInvalid,
    ] {
        assert!(got.contains(&code), "{code} missing from {got:?}");
    }
}

#[test]
fn an_entry_that_is_not_an_object_is_refused_on_its_own() {
    let overlay = parse_overlay(
        br#"{"mcpServers": {"a": [], "docs": {"url": "https://h/mcp", "description": "d"}}}"#,
    )
    .unwrap();
    assert_eq!(overlay.servers[0].problems()[0].code, Code::EntryNotObject);
    assert!(overlay.offered("docs").is_some());
    assert!(overlay.offered("a").is_none());
    assert!(!overlay.all_valid());
}

#[test]
fn the_file_reads_whole_or_not_at_all() {
    let ok = parse_overlay(br#"{"mcpServers": {}}"#).unwrap();
    assert!(ok.servers.is_empty() && ok.codemode_models && ok.all_valid());
    assert!(
        !parse_overlay(br#"{"mcpServers": {}, "codemodeModels": false}"#)
            .unwrap()
            .codemode_models
    );

    for (text, code) in [
        (&b"{\"mcpServers\": {},}"[..], "not-json"),
        (b"// c\n{\"mcpServers\": {}}", "not-json"),
        (b"", "not-json"),
        (b"[]", "top-level-invalid"),
        (b"{}", "top-level-invalid"),
        (b"{\"mcpServers\": []}", "top-level-invalid"),
        (b"{\"mcpServers\": {}, \"codemodeModels\": \"no\"}", "top-level-invalid"),
        (b"{\"mcpServers\": {}, \"autoEnableCodemode\": true}", "top-level-invalid"),
        (b"{\"mcpServers\": {}, \"mcpServers\": {}}", "duplicate-key"),
        (
            br#"{"mcpServers": {"a": {"url": "https://h/mcp", "description": "d", "headers": {"X": "${A}", "X": "${B}"}}}}"#,
            "duplicate-key",
        ),
        (b"{\"mcpServers\": {\"a\": {}, \"a\": {}}}", "duplicate-key"),
        (b"\xff\xfe{}", "not-utf8"),
    ] {
        let err = parse_overlay(text).unwrap_err();
        assert_eq!(err.code(), code, "{}", String::from_utf8_lossy(text));
    }
    let big = vec![b' '; MAX_FILE_BYTES + 1];
    assert_eq!(parse_overlay(&big).unwrap_err().code(), "file-too-large");
}

#[test]
fn servers_keep_their_file_order() {
    let overlay = parse_overlay(
        br#"{"mcpServers": {"zeta": {"url": "https://h/mcp", "description": "d"}, "alpha": {"command": "node", "description": "d", "enabled": false}}}"#,
    )
    .unwrap();
    let names: Vec<&str> = overlay.servers.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["zeta", "alpha"]);
    assert_eq!(overlay.servers[1].transport, Some(TransportKind::Stdio));
    assert!(overlay.entry("alpha").unwrap().verdict.is_ok());
    assert!(overlay.offered("alpha").is_none());
}

#[test]
fn the_spec_example_is_valid() {
    let text = br#"{
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
        }
      }
    }"#;
    let overlay = parse_overlay(text).unwrap();
    assert!(overlay.all_valid());
    let docs = overlay.offered("docs").unwrap();
    assert_eq!(
        docs.references()
            .into_iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>(),
        ["DOCS_TOKEN"]
    );
    let files = overlay.offered("files").unwrap();
    assert_eq!(files.exposure, Some(Exposure::Deferred));
    assert_eq!(
        files
            .references()
            .into_iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>(),
        ["FILES_TOKEN"]
    );
}

#[test]
fn a_package_runner_is_reported_beside_other_problems() {
    let got = codes(r#""command": "npx", "description": "d", "env": {"K": "literal"}"#);
    assert!(got.contains(&Code::PackageRunner), "{got:?}");
    assert!(got.contains(&Code::EnvLiteral), "{got:?}");
}

#[test]
fn a_refused_entry_still_tells_its_transport_when_its_keys_do() {
    assert_eq!(
        entry(&format!(r#"{HTTP}, "type": "sse""#)).transport,
        Some(TransportKind::Http)
    );
    assert_eq!(
        entry(&format!(r#"{STDIO}, "type": "ws""#)).transport,
        Some(TransportKind::Stdio)
    );
    assert_eq!(entry(r#""description": "d""#).transport, None);
    assert_eq!(
        entry(r#""description": "d", "type": "stdio""#).transport,
        Some(TransportKind::Stdio)
    );
    assert_eq!(
        entry(r#""url": "https://h/mcp", "command": "node", "description": "d""#).transport,
        None
    );
}

#[test]
fn contents_are_checked_even_when_the_transport_is_in_doubt() {
    let got = codes(
        r#""type": "sse", "url": "https://h/mcp", "headers": {"A": "lit"}, "description": "d""#,
    );
    assert!(
        got.contains(&Code::TypeSse) && got.contains(&Code::HeaderLiteral),
        "{got:?}"
    );
    let got = codes(
        r#""url": "HTTPS://h/mcp", "command": "npx", "args": ["~x"], "env": {"K": "lit"}, "description": "d""#,
    );
    for code in [
        Code::TransportConflict,
        Code::UrlNotPlain,
        Code::PackageRunner,
        Code::ArgumentHome,
        Code::EnvLiteral,
    ] {
        assert!(got.contains(&code), "{code} missing from {got:?}");
    }
}

#[test]
fn long_or_odd_key_names_are_not_printed_as_fields() {
    let long = "X".repeat(65);
    let p = entry(&format!(r#"{HTTP}, "headers": {{"{long}": "lit"}}"#)).problems()[0].clone();
    assert_eq!((p.code, p.field.as_str()), (Code::HeaderLiteral, "headers"));
    let p = entry(&format!(r#"{STDIO}, "env": {{"{long}": "lit"}}"#)).problems()[0].clone();
    assert_eq!((p.code, p.field.as_str()), (Code::EnvLiteral, "env"));
    let p = entry(&format!(r#"{STDIO}, "env": {{"K": "lit"}}"#)).problems()[0].clone();
    assert_eq!(p.field, "env.K");
}

#[test]
fn a_named_read_judges_only_the_named_entries_but_reads_the_whole_file() {
    let text = br#"{"mcpServers": {"a": {"url": "https://h/mcp", "description": "d"}, "bad": {"cwd": "/"}, "b": {"command": "node", "description": "d"}}}"#;
    let overlay = parse_overlay_named(text, &["b", "missing"]).unwrap();
    assert_eq!(overlay.servers.len(), 1);
    assert!(overlay.offered("b").is_some());
    assert!(overlay.entry("a").is_none());
    // A duplicate key outside the named entries still refuses the file.
    let dup = br#"{"mcpServers": {"a": {"url": "https://h/mcp", "url": "https://i/mcp"}, "b": {"command": "node", "description": "d"}}}"#;
    assert_eq!(
        parse_overlay_named(dup, &["b"]).unwrap_err().code(),
        "duplicate-key"
    );
}

#[test]
fn an_http_server_sending_headers_is_warned_of_not_refused() {
    let s = valid(
        r#""url": "http://mcp.example.com:8080/mcp", "description": "d", "headers": {"Authorization": "Bearer ${TOKEN}", "X-Team": "${TEAM}"}"#,
    );
    let w = s.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].code, "plain-http-credentials");
    assert_eq!(w[0].field, "url");
    assert_eq!(
        w[0].message,
        "the url is http://, so the credential in each header (Authorization, X-Team) would be sent in plain text across the network to mcp.example.com port 8080, readable on every hop"
    );
    assert!(w[0].fix.contains("https://"), "{w:?}");
    // To loopback it is still sent in plain text: the warning says where.
    for (url, place) in [
        (
            "http://localhost:3000/mcp",
            "to localhost port 3000, the loopback",
        ),
        ("http://127.0.0.1/mcp", "to 127.0.0.1 port 80, the loopback"),
        ("http://[::1]:9/mcp", "to [::1] port 9, the loopback"),
    ] {
        let s = valid(&format!(
            r#""url": "{url}", "description": "d", "headers": {{"X-Api-Key": "${{KEY}}"}}"#
        ));
        let w = s.warnings();
        assert_eq!(w.len(), 1, "{url}: {w:?}");
        assert!(w[0].message.contains("the header (X-Api-Key)"), "{w:?}");
        assert!(w[0].message.contains(place), "{url}: {}", w[0].message);
    }
    // https://, no headers, or stdio: nothing to say.
    for body in [
        r#""url": "https://h/mcp", "description": "d", "headers": {"Authorization": "Bearer ${T}"}"#,
        r#""url": "http://h:8080/mcp?k=${K}", "description": "d""#,
        r#""url": "http://h:8080/mcp", "description": "d", "headers": {}"#,
        STDIO,
    ] {
        assert_eq!(valid(body).warnings(), [], "{body}");
    }
}

/// Each way `url`, `command` and `type` disagree: one problem, its field and its message.
#[test]
fn the_transport_s_problems_name_their_field() {
    let cases = [
        (
            format!(r#"{HTTP}, "type": "sse""#),
            Code::TypeSse,
            "type",
            "the legacy SSE transport is not supported; use the server's streamable HTTP URL",
        ),
        (
            format!(r#"{HTTP}, "type": "websocket""#),
            Code::TypeInvalid,
            "type",
            "type must be http, streamable-http or stdio",
        ),
        (
            format!(r#"{HTTP}, "type": 1"#),
            Code::TypeInvalid,
            "type",
            "type must be http, streamable-http or stdio",
        ),
        (
            r#""url": "https://h/mcp", "command": "node", "description": "d""#.to_owned(),
            Code::TransportConflict,
            "url",
            "an entry has either url (streamable HTTP) or command (stdio), not both",
        ),
        (
            format!(r#"{HTTP}, "type": "stdio""#),
            Code::TypeMismatch,
            "type",
            "type says stdio but the entry has a url",
        ),
        (
            format!(r#"{STDIO}, "type": "streamable-http""#),
            Code::TypeMismatch,
            "type",
            "type says http but the entry has a command",
        ),
        (
            r#""description": "d", "type": "http""#.to_owned(),
            Code::TransportMissing,
            "url",
            "a streamable HTTP server needs a url",
        ),
        (
            r#""description": "d", "type": "stdio""#.to_owned(),
            Code::TransportMissing,
            "command",
            "a stdio server needs a command",
        ),
        (
            r#""description": "d""#.to_owned(),
            Code::TransportMissing,
            "",
            "an entry needs a url (streamable HTTP) or a command (stdio)",
        ),
    ];
    for (body, code, field, message) in cases {
        let problems: Vec<(Code, String, String)> = entry(&body)
            .problems()
            .iter()
            .map(|p| (p.code, p.field.clone(), p.message.clone()))
            .collect();
        assert_eq!(
            problems,
            [(code, field.to_owned(), message.to_owned())],
            "{body}"
        );
    }
}
