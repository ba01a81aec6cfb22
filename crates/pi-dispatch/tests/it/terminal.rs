//! What the CLI prints from a job's data is inert: a record whose final message, tool names,
//! detail, task and issue, and a transcript, are full of terminal escapes (a title, a screen clear, OSC 52 to the
//! clipboard, an 8-bit CSI) print none of them raw, in any form; `--transcript --raw` prints the
//! bytes as the job wrote them (the control: the escapes are really there).

use serde_json::{Value, json};
use testkit::fake_model::Step;

use crate::worker::{Service, stdio};

/// Escapes a hijacked job would plant: a window title, a screen clear, a clipboard write, a
/// carriage return over the line, and an 8-bit CSI.
const ESCAPES: &str = "\u{1b}]0;owned\u{7}\u{1b}[2J\u{1b}]52;c;cm0gLXJmIH4=\u{7}\r\u{9b}31m";

/// Whether `bytes` hold a control character a terminal acts on (all but line ends and tabs).
fn raw_controls(bytes: &str) -> Vec<char> {
    bytes
        .chars()
        .filter(|c| c.is_control() && *c != '\n' && *c != '\t')
        .collect()
}

#[test]
fn nothing_a_job_wrote_drives_the_terminal() {
    let s = Service::new(
        vec![Step::text("done")],
        |_| json!({"direct": stdio(Some("direct"))}),
        "",
    );
    let (id, _, _, _) = s.complete("Say done.", "direct");
    // The record and transcript as a hijacked job would leave them.
    let mut record: Value = s.d.record(&id).unwrap();
    record["finalMessage"] = json!(format!("all tests pass{ESCAPES}"));
    record["detail"] = json!({"why": format!("why{ESCAPES}")});
    record["task"] = json!(format!("the task{ESCAPES}"));
    record["item"] = json!(format!("o/r#1{ESCAPES}"));
    record["mcp"]["toolCalls"] = json!([{"server": format!("srv{ESCAPES}"), "tool": format!("tool{ESCAPES}"),
        "calls": 1, "ok": 1, "error": 0, "refused": 0, "totalMs": 1, "resultBytes": 1}]);
    s.d.replace_record(&id, &record);
    let transcript = s.d.path().join(format!("state/jobs/{id}/transcript.jsonl"));
    let mut kept = std::fs::read(&transcript).unwrap();
    kept.extend_from_slice(format!("{ESCAPES}\n").as_bytes());
    std::fs::write(&transcript, &kept).unwrap();

    for args in [
        &["runs"][..],
        &["runs", "--json"][..],
        &["runs", "show", &id][..],
        &["runs", "show", &id, "--json"][..],
        &["runs", "show", &id, "--transcript"][..],
        &["status"][..],
        &["status", "--json"][..],
    ] {
        let shown = s.d.run(args);
        assert_eq!(shown.code, 0, "{args:?}: {}", shown.stderr);
        assert_eq!(raw_controls(&shown.stdout), Vec::<char>::new(), "{args:?}");
        if args.contains(&"--json") {
            let value: Value = serde_json::from_str(&shown.stdout).unwrap();
            // Still the same data: the escapes are JSON's own.
            if args.contains(&"show") {
                assert_eq!(value["finalMessage"], record["finalMessage"], "{args:?}");
            }
        }
    }
    let human = s.d.run(&["runs", "show", &id]);
    assert!(
        human
            .stdout
            .contains("all tests pass\\u001b]0;owned\\u0007"),
        "{}",
        human.stdout
    );
    assert!(human.stdout.contains("tool srv\\u001b"), "{}", human.stdout);
    // The control: raw, the transcript holds the bytes the job wrote.
    let raw = s.d.run(&["runs", "show", &id, "--transcript", "--raw"]);
    assert_eq!(raw.code, 0, "{}", raw.stderr);
    assert!(raw.stdout.contains(ESCAPES), "{:?}", raw.stdout);
}
