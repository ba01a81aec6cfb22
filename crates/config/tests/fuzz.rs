//! Property tests that fuzz the readers: none of them may panic, whatever the input, and the laws
//! that make them trustworthy (a plain URL is written back unchanged, a suggested plain form is
//! accepted, no value reaches a message) hold on generated input.
//!
//! The number of cases is fixed, so CI spends a bounded time here; `PROPTEST_CASES` raises it for a
//! longer local run.

// Test code fails loudly on purpose; the workspace denies unwrap only in product code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use config::mcp::{self, parse_overlay};
use config::reference::Template;
use config::url::{self, UrlProblem};
use config::{dotenv, egress, endpoints, import, json, models};
use proptest::prelude::*;

/// Cases per property: the environment's `PROPTEST_CASES`, else `default`.
fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Valid files that mutations start from.
const CORPUS: &[&str] = &[
    r#"{"mcpServers": {}}"#,
    r#"{"mcpServers": {"docs": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}, "description": "Search the docs", "exposure": "codemode"}}, "codemodeModels": false}"#,
    r#"{"mcpServers": {"files": {"command": "/opt/pi-global/mcp/files-server", "args": ["--root", "/workspace", "--token=${T}"], "env": {"FILES_TOKEN": "${FILES_TOKEN}"}, "description": "Index", "exposure": "deferred", "toolExposure": {"search": "direct", "admin_*": "hidden"}, "timeout": 30, "enabled": true}}}"#,
    r#"{"mcpServers": {"mem": {"type": "stdio", "command": "npx", "args": ["-y", "pkg"], "allowPackageRunner": true, "description": "Memory"}, "zap": {"type": "streamable-http", "url": "https://a.example.com/mcp/${ZAP_KEY}/sse?api_key=${KEY}", "description": "Zap"}}}"#,
];

/// Fragments that steer mutations toward the rules' edges.
const TOKENS: &[&str] = &[
    "\"",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "${",
    "${A}",
    "}",
    "$",
    "!",
    "~",
    "/",
    "..",
    ":443",
    ":80",
    "HTTPS",
    "http://",
    "@",
    "#",
    "?",
    "&",
    "=",
    "\\",
    "\\u2028",
    "\\u200b",
    "\\n",
    "\u{2028}",
    "\u{feff}",
    "npx",
    "/usr/bin/",
    "sse",
    "oauth",
    "cwd",
    "dispatch",
    "forge",
    "\"url\": ",
    "\"command\": ",
    "\"enabled\": ",
    "true",
    "null",
    "1e400",
    "-0",
    "600",
    "601",
    "\"mcpServers\": ",
    "//",
    "/*",
    "\u{0}",
];

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Duplicate(usize, usize, usize),
    Token(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), 1usize..16).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (any::<usize>(), 1usize..32, any::<usize>())
            .prop_map(|(i, n, at)| Mutation::Duplicate(i, n, at)),
        (any::<usize>(), 0..TOKENS.len()).prop_map(|(i, t)| Mutation::Token(i, t)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let len = bytes.len().max(1);
    match m {
        Mutation::Flip(i, b) => {
            if !bytes.is_empty() {
                let i = i % bytes.len();
                bytes[i] ^= b | 1;
            }
        }
        Mutation::Insert(i, ins) => {
            let i = i % len;
            let i = i.min(bytes.len());
            bytes.splice(i..i, ins.iter().copied());
        }
        Mutation::Delete(i, n) => {
            if !bytes.is_empty() {
                let i = i % bytes.len();
                let end = (i + n).min(bytes.len());
                bytes.drain(i..end);
            }
        }
        Mutation::Duplicate(i, n, at) => {
            if !bytes.is_empty() {
                let i = i % bytes.len();
                let end = (i + n).min(bytes.len());
                let piece: Vec<u8> = bytes[i..end].to_vec();
                let at = (at % len).min(bytes.len());
                bytes.splice(at..at, piece);
            }
        }
        Mutation::Token(i, t) => {
            let i = (i % len).min(bytes.len());
            bytes.splice(i..i, TOKENS[*t].bytes());
        }
    }
}

/// Exercises everything a later reader of an overlay touches, so a panic anywhere in it shows.
fn exercise(bytes: &[u8]) {
    if let Ok(overlay) = parse_overlay(bytes) {
        for entry in &overlay.servers {
            for p in entry.problems() {
                let _ = p.to_string();
            }
            if let Ok(server) = &entry.verdict {
                let _ = server.references();
                let _ = server.package_runner();
                if let mcp::Transport::Http(h) = &server.transport {
                    // A URL that was accepted is written back exactly as it was written.
                    let again = url::parse(&h.url.to_string()).unwrap();
                    assert_eq!(again, h.url);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(cases(3000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        exercise(&bytes);
        let _ = models::check(&bytes);
        let _ = import::plan_mcp(&bytes).map(|p| p.overlay_file());
        if let Ok(text) = std::str::from_utf8(&bytes) {
            let _ = egress::parse_allowlist(text);
            let _ = endpoints::parse_model_endpoints(text);
            let _ = json::parse(text);
            let _ = dotenv::parse(text);
            let _ = url::parse(text);
            let _ = Template::parse(text);
        }
    }

    #[test]
    fn mutated_valid_files_never_panic(
        start in 0..CORPUS.len(),
        mutations in proptest::collection::vec(mutation(), 1..12),
    ) {
        let mut bytes = CORPUS[start].as_bytes().to_vec();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        exercise(&bytes);
        // The import plan reads the same files as the host's: what it stages must read as an overlay.
        if let Ok(plan) = import::plan_mcp(&bytes)
            && let Some(text) = plan.overlay_file()
        {
            prop_assert!(parse_overlay(text.as_bytes()).is_ok_and(|o| o.all_valid()));
        }
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,300}") {
        exercise(text.as_bytes());
        let _ = url::parse(&text);
        let _ = dotenv::parse(&text);
        let _ = egress::parse_allowlist(&text);
        let _ = endpoints::parse_model_endpoints(&text);
        let _ = models::check(text.as_bytes());
    }
}

fn url_like() -> impl Strategy<Value = String> {
    // Each part is plain most of the time, so that whole URLs are accepted often enough for the
    // laws below to bite on both sides (see `the_url_generator_covers_both_verdicts`).
    let scheme =
        prop_oneof![6 => Just("https"), 3 => Just("http"), 1 => Just("HTTPS"), 1 => Just("ftp")];
    let slashes =
        prop_oneof![12 => Just("://"), 1 => Just(":"), 1 => Just(":/"), 1 => Just(":///")];
    let userinfo = prop_oneof![12 => Just(""), 1 => Just("u@"), 1 => Just("u:p@")];
    let host = prop_oneof![
        10 => "[a-z][a-z0-9-]{0,8}(\\.[a-z]{2,5}){0,2}",
        1 => "[A-Za-z]{1,6}\\.[A-Za-z]{2,4}",
        1 => "127\\.0\\.0\\.1",
        1 => "\\[::1\\]",
        1 => "\\$\\{H\\}",
    ];
    let port = prop_oneof![
        10 => Just(""),
        3 => Just(":8080"),
        1 => Just(":"),
        1 => Just(":443"),
        1 => Just(":80"),
        1 => Just(":0"),
        1 => Just(":99999"),
        1 => Just(":0443"),
    ];
    let segment = prop_oneof![
        12 => "[a-z0-9._~-]{1,6}",
        2 => "\\$\\{[A-Z]{1,3}\\}",
        1 => Just(".".to_owned()),
        1 => Just("..".to_owned()),
        1 => Just("%2F".to_owned()),
        1 => Just("%zz".to_owned()),
    ];
    let path = proptest::collection::vec(segment, 0..4)
        .prop_map(|s| s.iter().map(|seg| format!("/{seg}")).collect::<String>());
    let query = prop_oneof![
        8 => Just(String::new()),
        4 => "\\?[a-z]{1,4}=\\$\\{[A-Z]{1,3}\\}(&[a-z]{1,4}=\\$\\{[A-Z]{1,3}\\}){0,2}",
        1 => Just("?".to_owned()),
        1 => "\\?[a-z]{1,4}=[a-z]{1,4}",
    ];
    let fragment = prop_oneof![12 => Just(""), 1 => Just("#"), 1 => Just("#f")];
    (scheme, slashes, userinfo, host, port, path, query, fragment)
        .prop_map(|(s, sl, u, h, p, pa, q, f)| format!("{s}{sl}{u}{h}{p}{pa}{q}{f}"))
}

proptest! {
    #![proptest_config(cases(3000))]

    #[test]
    fn an_accepted_url_is_written_back_unchanged(text in url_like()) {
        if let Ok(u) = url::parse(&text) {
            prop_assert_eq!(u.to_string(), text);
        }
    }

    #[test]
    fn a_suggested_plain_form_is_accepted(text in url_like()) {
        if let Err(problems) = url::parse(&text) {
            for p in problems {
                if let UrlProblem::NotPlain { plain, .. }
                | UrlProblem::Credentials { plain }
                | UrlProblem::Fragment { plain } = p
                {
                    // With a refused query value, the suggestion leaves the query out as `?…`;
                    // the rest of it must still be plain.
                    let rest = plain.strip_suffix("?…").unwrap_or(&plain);
                    prop_assert!(url::parse(rest).is_ok(), "{} suggested {}", text, plain);
                }
            }
        }
    }

    #[test]
    fn a_template_is_written_back_unchanged(text in "[a-zA-Z0-9=/_ ${}-]{0,40}") {
        if let Ok(t) = Template::parse(&text) {
            prop_assert_eq!(t.to_string(), text);
        }
    }
}

/// A value that must never be quoted back: the canary is the whole value or part of it.
fn secret_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("CNRY-7f3a".to_owned()),
        Just("Bearer CNRY-7f3a".to_owned()),
        Just("!cat CNRY-7f3a".to_owned()),
        Just("$CNRY-7f3a".to_owned()),
        Just("${CNRY-7f3a}".to_owned()),
        Just("x${A}CNRY-7f3a".to_owned()),
        Just("~/CNRY-7f3a".to_owned()),
        Just("--key=CNRY-7f3a".to_owned()),
        Just("${BROKEN CNRY-7f3a".to_owned()),
    ]
}

fn generated_entry() -> impl Strategy<Value = String> {
    (
        secret_value(),
        secret_value(),
        secret_value(),
        secret_value(),
        any::<bool>(),
        0u8..4,
    )
        .prop_map(|(header, env, query, arg, http, extra)| {
            let extra = match extra {
                0 => r#", "type": "sse""#,
                1 => r#", "cwd": "/tmp""#,
                2 => r#", "timeout": 0"#,
                _ => "",
            };
            let quote = |s: &str| serde_json::to_string(s).unwrap();
            if http {
                format!(
                    r#"{{"url": {}, "headers": {{"Authorization": {}}}, "description": "d"{extra}}}"#,
                    quote(&format!("HTTPS://h.example.com:443/mcp?k={query}#frag-CNRY-7f3a")),
                    quote(&header)
                )
            } else {
                format!(
                    r#"{{"command": "npx", "args": [{}], "env": {{"K": {}}}, "description": "d"{extra}}}"#,
                    quote(&arg),
                    quote(&env)
                )
            }
        })
}

proptest! {
    #![proptest_config(cases(1000))]

    #[test]
    fn no_value_reaches_a_message(entries in proptest::collection::vec(generated_entry(), 1..6)) {
        let body: Vec<String> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| format!(r#""s{i}": {e}"#))
            .collect();
        let text = format!(r#"{{"mcpServers": {{{}}}}}"#, body.join(", "));
        let overlay = parse_overlay(text.as_bytes()).unwrap();
        for entry in &overlay.servers {
            for p in entry.problems() {
                prop_assert!(!p.to_string().contains("CNRY"), "{}", p);
            }
        }
    }
}

/// The URL generator reaches accepted URLs and each kind of refusal, so the laws above are tested
/// on both sides rather than holding vacuously.
#[test]
fn the_url_generator_covers_both_verdicts() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut accepted, mut not_plain, mut other) = (0, 0, 0);
    for _ in 0..2000 {
        let text = url_like().new_tree(&mut runner).unwrap().current();
        match url::parse(&text) {
            Ok(_) => accepted += 1,
            Err(ps) if ps.iter().any(|p| matches!(p, UrlProblem::NotPlain { .. })) => {
                not_plain += 1
            }
            Err(_) => other += 1,
        }
    }
    assert!(
        accepted > 50 && not_plain > 50 && other > 50,
        "{accepted} {not_plain} {other}"
    );
}
