//! `pi-dispatch doctor` on the servers' pins, with pins and drift put in the deployment's real
//! SQLite queue through the queue's own API, as the worker puts them: a server with no pin yet is
//! a note, a pinned one passes, drift seen after the pin warns with its kinds, job and fix (and
//! stops warning once approved, or when older than the pin), hostile tool names reach the
//! terminal without their control characters, and a pin or drift entry that is not JSON or is
//! huge is said to be unreadable while the others still read; on Redis the same, and a Redis that
//! does not answer is one warning.

use std::time::{Duration, SystemTime};

use protocol::pins::{
    Comparison, Drift, DriftKind, Listing, ServerInfo, StoredDrift, StoredPin, digest,
};
use queue::Queue as _;

use crate::common::{Deployment, Run};
use crate::doctor::realistic;

/// The deployment's queue, as the worker opens it.
fn store(d: &Deployment) -> queue::SqliteQueue {
    queue::SqliteQueue::open(&queue::sqlite_path(d.path())).unwrap()
}

fn at(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

fn listing(tools: &[&str]) -> Listing {
    Listing::of(
        ServerInfo {
            name: Some("docs-server".into()),
            version: Some("1.0.0".into()),
        },
        tools
            .iter()
            .map(|t| (*t, r#"{"name":"x","description":"d"}"#)),
    )
}

fn pin(q: &dyn queue::Queue, server: &str, tools: &[&str], ms: u64) {
    let pin = StoredPin {
        definitions: Default::default(),
        listing: listing(tools),
        pinned_at_ms: ms,
        by: "job job-first".into(),
    };
    let text = serde_json::to_string(&pin).unwrap();
    assert!(q.put_pin(server, &text, false, at(ms)).unwrap());
}

/// Drift as a job under withhold notes it: each tool with its kind.
fn drift(q: &dyn queue::Queue, server: &str, job: &str, tools: &[(&str, DriftKind)], ms: u64) {
    let drift = StoredDrift {
        definitions: Default::default(),
        job_id: job.into(),
        seen_at_ms: ms,
        listing: listing(&[]),
        comparison: Comparison {
            unpinnable: 0,
            first_use: false,
            drift: tools
                .iter()
                .map(|(tool, kind)| Drift {
                    tool: (*tool).into(),
                    kind: *kind,
                    pinned: (*kind != DriftKind::New).then(|| digest("{}")),
                    seen: digest(r#"{"a":1}"#),
                })
                .collect(),
            gone: Vec::new(),
        },
    };
    let text = serde_json::to_string(&drift).unwrap();
    q.put_pin_drift(server, &text, at(ms)).unwrap();
}

fn pin_lines(run: &Run) -> Vec<&str> {
    run.stdout.lines().filter(|l| l.contains(" pin")).collect()
}

fn line_of<'a>(run: &'a Run, server: &str) -> &'a str {
    let wanted = format!("server {server}");
    run.stdout
        .lines()
        .find(|l| l.contains("pin: ") && l.contains(&wanted))
        .unwrap_or_else(|| panic!("no pin line for {server}:\n{}", run.stdout))
}

fn check<'a>(json: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no check {id} in {json}"))
}

#[test]
fn each_server_is_pinned_not_yet_pinned_or_drifted_with_what_to_run() {
    let d = realistic();
    // No queue yet: every server is a note, and doctor makes no queue.
    let run = d.run(&["doctor"]);
    for server in ["docs", "memory", "wiki"] {
        assert!(
            line_of(&run, server).starts_with("✓ pin: ")
                && line_of(&run, server).contains("has none yet"),
            "{}",
            run.stdout
        );
    }
    assert!(!queue::sqlite_path(d.path()).exists());

    let q = store(&d);
    pin(&q, "docs", &["read", "search"], 1_796_000_000_000);
    pin(&q, "wiki", &["page"], 1_796_000_000_000);
    drift(
        &q,
        "wiki",
        "job-saw-it",
        &[
            ("page", DriftKind::Changed),
            ("edit", DriftKind::New),
            ("delete", DriftKind::New),
        ],
        1_796_000_060_000,
    );
    let run = d.run(&["doctor"]);
    assert_eq!(
        line_of(&run, "docs"),
        "✓ pin: server docs: 2 tools pinned by job job-first, 2026-11-30 00:53:20 UTC"
    );
    assert!(
        line_of(&run, "memory").contains("has none yet"),
        "{}",
        run.stdout
    );
    let wiki = line_of(&run, "wiki");
    assert_eq!(
        wiki,
        "⚠ pin: server wiki's tools differ from its pin, not yet approved: 3 tools (1 changed, 2 new): page (changed), edit (new), delete (new); seen by job job-saw-it at 2026-11-30 00:54:20 UTC; jobs go on without them (withhold) or end (refuse)"
    );
    assert!(
        run.stdout.contains(
            "    fix: see what changed with `pi-dispatch mcp pins diff wiki`; approve it with `pi-dispatch mcp pin wiki`"
        ),
        "{}",
        run.stdout
    );
    // --json carries the same, under stable ids.
    let json: serde_json::Value =
        serde_json::from_str(&d.run(&["doctor", "--json"]).stdout).unwrap();
    assert_eq!(check(&json, "pins.server:wiki")["level"], "warn");
    assert!(
        check(&json, "pins.server:wiki")["fix"]
            .as_str()
            .unwrap()
            .contains("pi-dispatch mcp pin wiki")
    );
    assert_eq!(check(&json, "pins.server:docs")["level"], "ok");
    assert_eq!(check(&json, "pins.server:memory")["level"], "ok");

    // Approved (a pin stored again, as `mcp pin` stores it): the drift is gone with it.
    pin(&q, "wiki", &["page", "edit", "delete"], 1_796_000_120_000);
    let run = d.run(&["doctor"]);
    assert!(
        line_of(&run, "wiki").starts_with("✓ pin: server wiki: 3 tools"),
        "{}",
        run.stdout
    );
    // Drift noted against a pin replaced while its job ran is older than the pin: not waiting.
    drift(
        &q,
        "wiki",
        "job-late",
        &[("page", DriftKind::Changed)],
        1_796_000_100_000,
    );
    let run = d.run(&["doctor"]);
    assert!(
        line_of(&run, "wiki").starts_with("✓ pin: server wiki: 3 tools"),
        "{}",
        run.stdout
    );
    // The control: the same drift seen after the pin warns.
    drift(
        &q,
        "wiki",
        "job-later",
        &[("page", DriftKind::Changed)],
        1_796_000_180_000,
    );
    let run = d.run(&["doctor"]);
    assert!(
        line_of(&run, "wiki").starts_with("⚠ pin: server wiki's tools differ")
            && line_of(&run, "wiki").contains("job-later"),
        "{}",
        run.stdout
    );
}

#[test]
fn hostile_tool_names_reach_the_terminal_without_control_characters() {
    let d = realistic();
    let q = store(&d);
    pin(&q, "docs", &["read"], 1_796_000_000_000);
    let hostile =
        "<script>alert(1)</script>\u{1b}]0;owned\u{7}\u{1b}[2J\n✓ pin: all fine\u{202e}evil";
    drift(
        &q,
        "docs",
        "job-hostile\u{1b}[31m",
        &[
            (hostile, DriftKind::New),
            ("plain_tool", DriftKind::Changed),
        ],
        1_796_000_060_000,
    );
    for args in [&["doctor"][..], &["doctor", "--json"][..]] {
        let run = d.run(args);
        // The control: the probe reached the output, the plain tool and the printable text.
        assert!(
            run.stdout.contains("plain_tool (changed)"),
            "{}",
            run.stdout
        );
        assert!(
            run.stdout
                .contains("<script>alert(1)</script>]0;owned[2J✓ pin: all fineevil (new)"),
            "{}",
            run.stdout
        );
        assert!(run.stdout.contains("job-hostile[31m"), "{}", run.stdout);
        for c in ['\u{1b}', '\u{7}', '\u{202e}'] {
            assert!(!run.stdout.contains(c), "{c:?} in {}", run.stdout);
        }
        assert!(!run.stdout.contains("\\u001b"), "{}", run.stdout);
    }
    let run = d.run(&["doctor"]);
    // No line of its own: the name's line end was dropped with the rest.
    assert!(
        !run.stdout.lines().any(|l| l.starts_with("✓ pin: all fine")),
        "{}",
        run.stdout
    );
    assert_eq!(
        pin_lines(&run)
            .iter()
            .filter(|l| l.contains("server docs"))
            .count(),
        1
    );
}

#[test]
fn a_pin_or_drift_that_is_not_json_or_is_huge_is_said_to_be_unreadable() {
    let d = realistic();
    let q = store(&d);
    // The control: a good pin beside them reads.
    pin(&q, "docs", &["read"], 1_796_000_000_000);
    assert!(
        q.put_pin("memory", "{not json", false, at(1_796_000_000_000))
            .unwrap()
    );
    let mut huge = StoredPin {
        definitions: Default::default(),
        listing: listing(&["page"]),
        pinned_at_ms: 1_796_000_000_000,
        by: String::new(),
    };
    huge.by = "x".repeat(2 << 20);
    let huge = serde_json::to_string(&huge).unwrap();
    assert!(
        q.put_pin("wiki", &huge, false, at(1_796_000_000_000))
            .unwrap()
    );
    let run = d.run(&["doctor"]);
    assert!(
        line_of(&run, "docs").starts_with("✓ pin: server docs: 1 tool pinned"),
        "{}",
        run.stdout
    );
    assert_eq!(
        line_of(&run, "memory"),
        "⚠ pin: server memory's pin cannot be read (it is not JSON of the shape this version writes): the next job takes the server as unpinned, offers every tool it lists, and pins what it lists in its place"
    );
    assert_eq!(
        line_of(&run, "wiki"),
        format!(
            "⚠ pin: server wiki's pin cannot be read (it is {} bytes, more than the 1 MiB a pin or its drift can take): no worker wrote it",
            huge.len()
        )
    );
    assert!(
        !run.stdout.contains("xxxxxxxx"),
        "the entry's text was shown"
    );
    assert!(
        run.stdout
            .contains("fix: store its pin again: `pi-dispatch mcp pin memory`")
    );

    // A drift entry that does not read still says drift waits.
    q.put_pin_drift("docs", "[1, 2", at(1_796_000_060_000))
        .unwrap();
    let run = d.run(&["doctor"]);
    assert_eq!(
        line_of(&run, "docs"),
        "⚠ pin: a job saw server docs's tools differ from its pin, not yet approved, and what it noted cannot be read (it is not JSON of the shape this version writes)"
    );
    // Doctor still ends and judges the rest: only the missing image fails.
    assert_eq!(
        run.stdout.lines().filter(|l| l.starts_with('✗')).count(),
        1,
        "{}",
        run.stdout
    );
}

#[test]
fn on_redis_the_pins_are_read_from_the_shared_store_and_a_store_gone_is_one_warning() {
    let d = realistic();
    let env = std::fs::read_to_string(d.path().join(".env")).unwrap();
    let with = |queue: &str| {
        std::fs::write(d.path().join(".env"), format!("{env}PI_QUEUE={queue}\n")).unwrap()
    };
    let redis = testkit::redis::RedisServer::start();
    with(&redis.url());
    let q = queue::RedisQueue::open(&queue::RedisTarget {
        url: redis.url(),
        password: None,
    })
    .unwrap();
    pin(&q, "docs", &["read"], 1_796_000_000_000);
    pin(&q, "wiki", &["page"], 1_796_000_000_000);
    drift(
        &q,
        "wiki",
        "job-on-redis",
        &[("page", DriftKind::Changed)],
        1_796_000_060_000,
    );
    let run = d.run(&["doctor"]);
    assert!(
        line_of(&run, "docs").starts_with("✓ pin: server docs: 1 tool pinned"),
        "{}",
        run.stdout
    );
    assert!(
        line_of(&run, "memory").contains("has none yet"),
        "{}",
        run.stdout
    );
    assert!(
        line_of(&run, "wiki").starts_with("⚠ pin: server wiki's tools differ")
            && line_of(&run, "wiki").contains("job-on-redis"),
        "{}",
        run.stdout
    );
    assert!(
        !run.stdout.contains("pins cannot be read"),
        "{}",
        run.stdout
    );
    // No Redis there: one warning for the store, no line a server.
    with(&format!(
        "redis+unix://{}",
        d.path().join("no-redis.sock").display()
    ));
    let run = d.run(&["doctor"]);
    assert!(
        run.stdout
            .contains("⚠ pins: the servers' pins cannot be read from the queue's store: ")
            && run
                .stdout
                .contains("every job that names a server ends pins-unreadable"),
        "{}",
        run.stdout
    );
    assert_eq!(
        pin_lines(&run)
            .iter()
            .filter(|l| l.contains("pin: server"))
            .count(),
        0,
        "{}",
        run.stdout
    );
}
