//! One test (at least) per rule of `triggers.json`. Each refusal is a minimal file that the rule alone
//! refuses, checked to be refused at exactly the expected path.

use super::*;
use crate::json::JsonError;

const CRON: &str = r#""type": "cron", "id": "nightly", "pattern": "0 3 * * *""#;
const LOCAL: &str = r#""kind": "local", "flow": "fix", "folder": "/srv/repo", "task": "Tidy up""#;
const LABEL: &str = r#""type": "label", "any": ["pi"]"#;
const GITHUB: &str = r#""kind": "github", "flow": "fix""#;

/// A file of one trigger with these `on` and `run` members.
fn file(on: &str, run: &str) -> String {
    files(&[(on, run)])
}

fn files(triggers: &[(&str, &str)]) -> String {
    let items: Vec<String> = triggers
        .iter()
        .map(|(on, run)| format!(r#"{{"on": {{{on}}}, "run": {{{run}}}}}"#))
        .collect();
    format!(r#"{{"triggers": [{}]}}"#, items.join(", "))
}

/// A label-triggered github job with these extra `run` members.
fn github(extra: &str) -> String {
    file(LABEL, &format!("{GITHUB}, {extra}"))
}

/// A cron-triggered local job with these extra `run` members.
fn local(extra: &str) -> String {
    file(CRON, &format!("{LOCAL}, {extra}"))
}

fn parse(text: &str) -> Result<Triggers, TriggersError> {
    parse_triggers(text.as_bytes())
}

fn ok(text: &str) -> Triggers {
    match parse(text) {
        Ok(t) => t,
        Err(e) => panic!("{text}\nrefused: {e}"),
    }
}

fn run_of(text: &str) -> Run {
    ok(text).triggers.remove(0).run
}

fn on_of(text: &str) -> On {
    ok(text).triggers.remove(0).on
}

fn errors(text: &str) -> Vec<TriggerError> {
    match parse(text) {
        Ok(_) => panic!("{text}\nwas accepted"),
        Err(TriggersError::Invalid(errors)) => errors,
        Err(other) => panic!("{text}\nrefused as a whole: {other}"),
    }
}

/// Refused with exactly one error, at `path`; returns its message.
fn refused_only(text: &str, path: &str) -> String {
    let errors = errors(text);
    assert_eq!(
        errors.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(),
        [path],
        "{text}\n{errors:?}"
    );
    errors[0].message.clone()
}

// ---------------------------------------------------------------------------------------------
// The file as a whole

#[test]
fn an_empty_list_is_a_valid_file() {
    assert_eq!(ok(r#"{"triggers": []}"#), Triggers::default());
}

#[test]
fn the_base_files_of_these_tests_are_valid() {
    ok(&file(CRON, LOCAL));
    ok(&file(LABEL, GITHUB));
}

#[test]
fn top_level_must_be_an_object_with_triggers_only() {
    for text in ["[]", "null", r#""triggers""#, "1"] {
        refused_only(text, "");
    }
    let m = refused_only("{}", "");
    assert!(m.contains("triggers"), "{m}");
    refused_only(r#"{"triggers": {}}"#, "triggers");
    refused_only(r#"{"triggers": null}"#, "triggers");
    refused_only(r#"{"triggers": [], "version": 1}"#, "version");
}

#[test]
fn an_unknown_top_level_key_does_not_hide_the_triggers_errors() {
    let text = format!(
        r#"{{"version": 1, "triggers": [{{"on": {{{LABEL}}}, "run": {{"kind": "github"}}}}]}}"#
    );
    let paths: Vec<String> = errors(&text).into_iter().map(|e| e.path).collect();
    assert_eq!(paths, ["version", "triggers[0].run"]);
}

#[test]
fn a_trigger_is_an_object_of_exactly_on_and_run() {
    refused_only(r#"{"triggers": [[]]}"#, "triggers[0]");
    refused_only(r#"{"triggers": ["x"]}"#, "triggers[0]");
    refused_only(
        r#"{"triggers": [{"run": {"kind": "github", "flow": "f"}}]}"#,
        "triggers[0].on",
    );
    refused_only(
        r#"{"triggers": [{"on": {"type": "label", "any": ["a"]}}]}"#,
        "triggers[0].run",
    );
    let text =
        format!(r#"{{"triggers": [{{"on": {{{LABEL}}}, "run": {{{GITHUB}}}, "enabled": true}}]}}"#);
    refused_only(&text, "triggers[0].enabled");
}

#[test]
fn on_and_run_must_be_objects() {
    let text = format!(r#"{{"triggers": [{{"on": "label", "run": {{{GITHUB}}}}}]}}"#);
    refused_only(&text, "triggers[0].on");
    let text = format!(r#"{{"triggers": [{{"on": {{{LABEL}}}, "run": []}}]}}"#);
    refused_only(&text, "triggers[0].run");
}

#[test]
fn a_duplicate_key_anywhere_refuses_the_file() {
    for text in [
        r#"{"triggers": [], "triggers": []}"#.to_owned(),
        r#"{"triggers": [{"on": {"type": "label", "type": "label", "any": ["a"]}, "run": {"kind": "github", "flow": "f"}}]}"#.to_owned(),
        github(r#""flow": "g""#),
        github(r#""secrets": {"A": "r", "A": "r"}, "secretsProfile": "ci""#),
        format!(r#"{{"triggers": [{{"on": {{{LABEL}}}, "on": {{{LABEL}}}, "run": {{{GITHUB}}}}}]}}"#),
    ] {
        assert!(
            matches!(parse(&text), Err(TriggersError::Json(JsonError::DuplicateKey { .. }))),
            "{text}"
        );
    }
}

#[test]
fn what_is_not_json_or_not_utf8_or_too_large_is_refused() {
    assert!(matches!(
        parse("{"),
        Err(TriggersError::Json(JsonError::Syntax { .. }))
    ));
    assert!(matches!(
        parse(r#"{"triggers": [],}"#),
        Err(TriggersError::Json(_))
    ));
    assert_eq!(
        parse_triggers(b"{\"triggers\": [\xff]}"),
        Err(TriggersError::NotUtf8)
    );
    let big = format!(r#"{{"triggers": []}}{}"#, " ".repeat(MAX_FILE_BYTES));
    assert_eq!(parse(&big), Err(TriggersError::TooLarge));
    assert_eq!(TriggersError::TooLarge.code(), "file-too-large");
    assert_eq!(parse("[").map_err(|e| e.code()), Err("not-json"));
    assert_eq!(
        parse(r#"{"a":1,"a":1}"#).map_err(|e| e.code()),
        Err("duplicate-key")
    );
    assert_eq!(parse("[]").map_err(|e| e.code()), Err("triggers-invalid"));
}

#[test]
fn errors_are_collected_from_every_trigger() {
    let text = files(&[
        (LABEL, r#""kind": "github", "flow": "Bad""#),
        (LABEL, GITHUB),
        (
            r#""type": "comment", "phrase": """#,
            r#""kind": "gitlab", "flow": "f", "mcp": []"#,
        ),
        (CRON, r#""kind": "github", "flow": "f""#),
    ]);
    let err = parse(&text).unwrap_err();
    let paths: Vec<&str> = err.errors().iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "triggers[0].run.flow",
            "triggers[2].on.phrase",
            "triggers[2].run.mcp",
            "triggers[3].run.kind",
        ]
    );
    // The file's message carries them all.
    let shown = err.to_string();
    for p in paths {
        assert!(shown.contains(p), "{shown}");
    }
}

#[test]
fn several_errors_in_one_trigger_are_all_reported() {
    let text = github(r#""image": "A", "maxCostUsd": 0, "mcp": ["forge", "forge"]"#);
    let paths: Vec<String> = errors(&text).into_iter().map(|e| e.path).collect();
    assert_eq!(
        paths,
        [
            "triggers[0].run.mcp[1]",
            "triggers[0].run.maxCostUsd",
            "triggers[0].run.image",
        ]
    );
}

#[test]
fn error_display_is_path_then_message() {
    let e = TriggerError::new("triggers[2].run.mcp[1]", "names the same server as mcp[0]");
    assert_eq!(
        e.to_string(),
        "triggers[2].run.mcp[1]: names the same server as mcp[0]"
    );
    assert_eq!(
        TriggerError::new("", "whole file").to_string(),
        "whole file"
    );
}

#[test]
fn indexes_are_kept() {
    let t = ok(&files(&[(LABEL, GITHUB), (CRON, LOCAL)]));
    assert_eq!(
        t.triggers.iter().map(|t| t.index).collect::<Vec<_>>(),
        [0, 1]
    );
    assert_eq!(t.triggers[1].on.type_name(), "cron");
}

// ---------------------------------------------------------------------------------------------
// on

#[test]
fn a_cron_trigger_reads() {
    let t = ok(&file(CRON, LOCAL)).triggers.remove(0);
    assert_eq!(
        t.on,
        On::Cron {
            id: "nightly".into(),
            pattern: "0 3 * * *".into()
        }
    );
    assert_eq!(t.on.type_name(), "cron");
    assert_eq!(
        t.run,
        Run {
            kind: Kind::Local,
            action: Action::Flow("fix".into()),
            folder: Some("/srv/repo".into()),
            task: Some("Tidy up".into()),
            mcp: None,
            secrets: Vec::new(),
            secrets_profile: None,
            provider: None,
            model: None,
            models: None,
            max_cost_usd: None,
            exclude_tools: Vec::new(),
            image: None,
            labels: Vec::new(),
            same_issue: SameIssue::Wait,
            pins: PinPolicy::Withhold,
        }
    );
}

#[test]
fn labels_name_what_a_worker_must_carry() {
    let t = ok(&file(
        CRON,
        &format!(r#"{LOCAL}, "labels": ["gpu", "zone:eu"]"#),
    ))
    .triggers
    .remove(0);
    assert_eq!(t.run.labels, ["gpu", "zone:eu"]);
    assert_eq!(t.job("j").labels, ["gpu", "zone:eu"]);
    for bad in [
        r#"[]"#,
        r#"["GPU"]"#,
        r#"["a:b:c"]"#,
        r#"["gpu", "gpu"]"#,
        r#""gpu""#,
        r#"[":x"]"#,
    ] {
        let text = file(CRON, &format!(r#"{LOCAL}, "labels": {bad}"#));
        assert!(
            errors(&text)
                .iter()
                .all(|e| e.path.starts_with("triggers[0].run.labels")),
            "{bad}: {:?}",
            errors(&text)
        );
        assert!(!errors(&text).is_empty(), "{bad} was taken");
    }
}

#[test]
fn same_issue_is_wait_or_cancel_older_and_only_for_forge_jobs() {
    let run = |same: &str| format!(r#"{GITHUB}, "sameIssue": {same}"#);
    assert_eq!(
        ok(&file(LABEL, GITHUB)).triggers[0].run.same_issue,
        SameIssue::Wait
    );
    assert_eq!(
        ok(&file(LABEL, &run(r#""cancel-older""#))).triggers[0]
            .run
            .same_issue,
        SameIssue::CancelOlder
    );
    assert_eq!(
        ok(&file(LABEL, &run(r#""wait""#))).triggers[0]
            .run
            .same_issue,
        SameIssue::Wait
    );
    refused_only(
        &file(LABEL, &run(r#""newest""#)),
        "triggers[0].run.sameIssue",
    );
    refused_only(
        &file(CRON, &format!(r#"{LOCAL}, "sameIssue": "wait""#)),
        "triggers[0].run.sameIssue",
    );
}

#[test]
fn on_needs_a_known_type() {
    refused_only(&file(r#""any": ["a"]"#, GITHUB), "triggers[0].on.type");
    refused_only(&file(r#""type": "push""#, GITHUB), "triggers[0].on.type");
    refused_only(
        &file(r#""type": "Label", "any": ["a"]"#, GITHUB),
        "triggers[0].on.type",
    );
    refused_only(
        &file(r#""type": ["label"], "any": ["a"]"#, GITHUB),
        "triggers[0].on.type",
    );
    // Keys no type knows are still refused when the type is wrong.
    let paths: Vec<String> = errors(&file(r#""type": "push", "branch": "x""#, GITHUB))
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(paths, ["triggers[0].on.type", "triggers[0].on.branch"]);
}

#[test]
fn a_key_of_another_type_is_refused_naming_its_type() {
    let m = refused_only(
        &file(&format!(r#"{CRON}, "phrase": "go""#), LOCAL),
        "triggers[0].on.phrase",
    );
    assert!(m.contains("comment"), "{m}");
    refused_only(
        &file(
            r#""type": "issue", "action": "opened", "any": ["a"]"#,
            GITHUB,
        ),
        "triggers[0].on.any",
    );
    refused_only(
        &file(&format!(r#"{LABEL}, "action": "opened""#), GITHUB),
        "triggers[0].on.action",
    );
    refused_only(
        &file(&format!(r#"{LABEL}, "branch": "main""#), GITHUB),
        "triggers[0].on.branch",
    );
}

#[test]
fn cron_needs_id_and_pattern() {
    refused_only(
        &file(r#""type": "cron", "pattern": "0 3 * * *""#, LOCAL),
        "triggers[0].on.id",
    );
    refused_only(
        &file(r#""type": "cron", "id": "n""#, LOCAL),
        "triggers[0].on.pattern",
    );
}

#[test]
fn cron_ids_are_names() {
    for good in ["a", "nightly-2", "x1-y2-z3", &"a".repeat(32)] {
        let on = format!(r#""type": "cron", "id": "{good}", "pattern": "* * * * *""#);
        ok(&file(&on, LOCAL));
    }
    for bad in [
        "",
        "Nightly",
        "a_b",
        "a--b",
        "-a",
        "a-",
        "a b",
        &"a".repeat(33),
    ] {
        let on = format!(r#""type": "cron", "id": "{bad}", "pattern": "* * * * *""#);
        refused_only(&file(&on, LOCAL), "triggers[0].on.id");
    }
    let on = r#""type": "cron", "id": 7, "pattern": "* * * * *""#;
    refused_only(&file(on, LOCAL), "triggers[0].on.id");
}

#[test]
fn cron_ids_are_unique_in_the_file() {
    let other = r#""type": "cron", "id": "weekly", "pattern": "0 0 * * 0""#;
    ok(&files(&[(CRON, LOCAL), (other, LOCAL)]));
    let m = refused_only(
        &files(&[(CRON, LOCAL), (LABEL, GITHUB), (CRON, LOCAL)]),
        "triggers[2].on.id",
    );
    assert!(m.contains("triggers[0]"), "{m}");
}

#[test]
fn cron_patterns_are_checked_as_the_worker_schedules_them() {
    for good in [
        "* * * * *",
        "0 3 * * *",
        "0 0 3 * * ?",
        "*/15 0-6,22 * JAN-MAR MON#2",
        "0 0 L * *",
        "0 0 15W * *",
    ] {
        let on = format!(r#""type": "cron", "id": "n", "pattern": "{good}""#);
        ok(&file(&on, LOCAL));
    }
    for bad in [
        "",
        "* * * *",
        "* * * * * * *",
        "*  * * * *",
        " * * * * *",
        "* * * * * ",
        "*\t* * * *",
        "* * * * $",
        "@daily",
        "* * * * *\n",
        // The right shape, and no time the worker could schedule.
        "61 * * * *",
        "*/0 * * * *",
        "0 25 * * *",
        "1-70 * * * *",
        "0 0 32 * *",
        "0 0 * 13 *",
    ] {
        let on = format!(r#""type": "cron", "id": "n", "pattern": {}"#, json_str(bad));
        refused_only(&file(&on, LOCAL), "triggers[0].on.pattern");
    }
    let on = r#""type": "cron", "id": "n", "pattern": 5"#;
    refused_only(&file(on, LOCAL), "triggers[0].on.pattern");
}

/// `s` as a JSON string literal.
fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

#[test]
fn a_label_trigger_reads() {
    let on = on_of(&file(
        r#""type": "label", "any": ["pi", "bot"], "all": ["ready"], "none": ["wip"]"#,
        GITHUB,
    ));
    assert_eq!(
        on,
        On::Label {
            any: vec!["pi".into(), "bot".into()],
            all: vec!["ready".into()],
            none: vec!["wip".into()],
        }
    );
    assert_eq!(on.type_name(), "label");
    ok(&file(r#""type": "label", "all": ["a", "b"]"#, GITHUB));
    ok(&file(
        r#""type": "label", "any": ["good first issue", "área: ✨"]"#,
        GITHUB,
    ));
}

#[test]
fn a_label_trigger_needs_any_or_all() {
    refused_only(&file(r#""type": "label""#, GITHUB), "triggers[0].on");
    refused_only(
        &file(r#""type": "label", "none": ["wip"]"#, GITHUB),
        "triggers[0].on",
    );
}

#[test]
fn label_lists_are_not_empty() {
    for (on, key) in [
        (r#""type": "label", "all": ["b"], "any": []"#, "any"),
        (r#""type": "label", "any": ["a"], "all": []"#, "all"),
        (r#""type": "label", "any": ["a"], "none": []"#, "none"),
    ] {
        let m = refused_only(&file(on, GITHUB), &format!("triggers[0].on.{key}"));
        assert!(m.contains("leave the field out"), "{m}");
    }
}

#[test]
fn label_lists_are_arrays_of_strings() {
    refused_only(
        &file(r#""type": "label", "any": "pi""#, GITHUB),
        "triggers[0].on.any",
    );
    refused_only(
        &file(r#""type": "label", "any": ["pi", 1]"#, GITHUB),
        "triggers[0].on.any[1]",
    );
    refused_only(
        &file(r#""type": "label", "all": [null]"#, GITHUB),
        "triggers[0].on.all[0]",
    );
}

#[test]
fn labels_are_one_line_short_and_not_blank() {
    let long = "l".repeat(MAX_LABEL_CHARS);
    ok(&file(
        &format!(r#""type": "label", "any": ["{long}"]"#),
        GITHUB,
    ));
    for bad in [
        String::new(),
        " ".to_owned(),
        "a\nb".to_owned(),
        "a\tb".to_owned(),
        "a\u{7}b".to_owned(),
        "a\u{2028}b".to_owned(),
        format!("{long}l"),
    ] {
        let on = format!(r#""type": "label", "any": ["ok", {}]"#, json_str(&bad));
        refused_only(&file(&on, GITHUB), "triggers[0].on.any[1]");
    }
}

#[test]
fn labels_in_a_list_are_distinct() {
    let m = refused_only(
        &file(r#""type": "label", "any": ["a", "b", "a"]"#, GITHUB),
        "triggers[0].on.any[2]",
    );
    assert!(m.contains("any[0]"), "{m}");
    refused_only(
        &file(
            r#""type": "label", "any": ["x"], "none": ["a", "a"]"#,
            GITHUB,
        ),
        "triggers[0].on.none[1]",
    );
    // Labels differing in case are different strings.
    ok(&file(r#""type": "label", "any": ["a", "A"]"#, GITHUB));
}

#[test]
fn a_label_both_wanted_and_refused_is_refused() {
    refused_only(
        &file(
            r#""type": "label", "any": ["a", "b"], "none": ["c", "a"]"#,
            GITHUB,
        ),
        "triggers[0].on.none[1]",
    );
    refused_only(
        &file(r#""type": "label", "all": ["a"], "none": ["a"]"#, GITHUB),
        "triggers[0].on.none[0]",
    );
}

#[test]
fn a_comment_trigger_reads() {
    let on = on_of(&file(r#""type": "comment", "phrase": "/pi fix""#, GITHUB));
    assert_eq!(
        on,
        On::Comment {
            phrase: "/pi fix".into()
        }
    );
    assert_eq!(on.type_name(), "comment");
    let long = "p".repeat(MAX_PHRASE_CHARS);
    ok(&file(
        &format!(r#""type": "comment", "phrase": "{long}""#),
        GITHUB,
    ));
}

#[test]
fn a_comment_phrase_is_one_short_line() {
    refused_only(
        &file(r#""type": "comment""#, GITHUB),
        "triggers[0].on.phrase",
    );
    for bad in [
        String::new(),
        "   ".to_owned(),
        "a\nb".to_owned(),
        "a\rb".to_owned(),
        "a\u{0}b".to_owned(),
        "a\u{2029}".to_owned(),
        "p".repeat(MAX_PHRASE_CHARS + 1),
    ] {
        let on = format!(r#""type": "comment", "phrase": {}"#, json_str(&bad));
        refused_only(&file(&on, GITHUB), "triggers[0].on.phrase");
    }
    refused_only(
        &file(r#""type": "comment", "phrase": true"#, GITHUB),
        "triggers[0].on.phrase",
    );
}

#[test]
fn pull_request_and_issue_actions() {
    for action in PULL_REQUEST_ACTIONS {
        let on = on_of(&file(
            &format!(r#""type": "pull_request", "action": "{action}""#),
            GITHUB,
        ));
        assert_eq!(
            on,
            On::PullRequest {
                action: action.into()
            }
        );
        assert_eq!(on.type_name(), "pull_request");
    }
    for action in ISSUE_ACTIONS {
        let on = on_of(&file(
            &format!(r#""type": "issue", "action": "{action}""#),
            GITHUB,
        ));
        assert_eq!(
            on,
            On::Issue {
                action: action.into()
            }
        );
        assert_eq!(on.type_name(), "issue");
    }
    for bad in ["closed", "Opened", "opened ", "", "ready_for_review"] {
        let on = format!(r#""type": "issue", "action": "{bad}""#);
        refused_only(&file(&on, GITHUB), "triggers[0].on.action");
    }
    for bad in ["closed", "merged", "OPENED"] {
        let on = format!(r#""type": "pull_request", "action": "{bad}""#);
        refused_only(&file(&on, GITHUB), "triggers[0].on.action");
    }
    refused_only(&file(r#""type": "issue""#, GITHUB), "triggers[0].on.action");
    refused_only(
        &file(r#""type": "pull_request", "action": ["opened"]"#, GITHUB),
        "triggers[0].on.action",
    );
}

// ---------------------------------------------------------------------------------------------
// run: kind, action, folder and task

#[test]
fn every_kind_reads() {
    for kind in Kind::ALL {
        assert_eq!(Kind::parse(kind.as_str()), Some(kind));
        if kind == Kind::Local {
            continue;
        }
        let run = run_of(&file(LABEL, &format!(r#""kind": "{kind}", "flow": "f""#)));
        assert_eq!(run.kind, kind);
    }
    assert_eq!(run_of(&file(CRON, LOCAL)).kind, Kind::Local);
}

#[test]
fn kind_is_required_and_known() {
    refused_only(&file(LABEL, r#""flow": "f""#), "triggers[0].run.kind");
    for bad in [r#""GitHub""#, r#""bitbucket""#, r#""""#, "1", "null"] {
        refused_only(
            &file(LABEL, &format!(r#""kind": {bad}, "flow": "f""#)),
            "triggers[0].run.kind",
        );
    }
}

#[test]
fn a_cron_trigger_runs_a_local_job_only() {
    for kind in ["github", "gitlab", "forgejo", "azure"] {
        let m = refused_only(
            &file(CRON, &format!(r#""kind": "{kind}", "flow": "f""#)),
            "triggers[0].run.kind",
        );
        assert!(m.contains("forge token"), "{m}");
    }
}

#[test]
fn a_local_job_is_for_cron_only() {
    for on in [
        LABEL,
        r#""type": "comment", "phrase": "go""#,
        r#""type": "issue", "action": "opened""#,
        r#""type": "pull_request", "action": "opened""#,
    ] {
        refused_only(&file(on, LOCAL), "triggers[0].run.kind");
    }
}

#[test]
fn exactly_one_of_flow_or_command() {
    assert_eq!(
        run_of(&github("\"image\": \"x\"")).action,
        Action::Flow("fix".into())
    );
    let run = run_of(&file(LABEL, r#""kind": "github", "command": "make docs""#));
    assert_eq!(run.action, Action::Command("make docs".into()));
    refused_only(&file(LABEL, r#""kind": "github""#), "triggers[0].run");
    refused_only(&github(r#""command": "make""#), "triggers[0].run");
}

#[test]
fn flows_are_names() {
    for good in ["fix", "answer-2", &"f".repeat(MAX_FLOW_CHARS)] {
        ok(&file(
            LABEL,
            &format!(r#""kind": "github", "flow": "{good}""#),
        ));
    }
    for bad in [
        r#""""#,
        r#""Fix""#,
        r#""a_b""#,
        r#""a--b""#,
        "1",
        "null",
        &format!(r#""{}""#, "f".repeat(65)),
    ] {
        refused_only(
            &file(LABEL, &format!(r#""kind": "github", "flow": {bad}"#)),
            "triggers[0].run.flow",
        );
    }
}

#[test]
fn commands_are_one_short_line() {
    let long = "c".repeat(MAX_COMMAND_CHARS);
    ok(&file(
        LABEL,
        &format!(r#""kind": "github", "command": "{long}""#),
    ));
    for bad in [
        json_str(""),
        json_str(" "),
        json_str("a\nb"),
        json_str("a\u{1b}[1m"),
        json_str(&format!("{long}c")),
        "[\"make\"]".to_owned(),
    ] {
        refused_only(
            &file(LABEL, &format!(r#""kind": "github", "command": {bad}"#)),
            "triggers[0].run.command",
        );
    }
}

#[test]
fn a_local_job_needs_folder_and_task() {
    refused_only(
        &file(CRON, r#""kind": "local", "flow": "f", "task": "t""#),
        "triggers[0].run.folder",
    );
    refused_only(
        &file(CRON, r#""kind": "local", "flow": "f", "folder": "/r""#),
        "triggers[0].run.task",
    );
}

#[test]
fn folder_and_task_are_refused_on_other_kinds() {
    for kind in ["github", "gitlab", "forgejo", "azure"] {
        let run = format!(r#""kind": "{kind}", "flow": "f", "folder": "/r""#);
        refused_only(&file(LABEL, &run), "triggers[0].run.folder");
        let run = format!(r#""kind": "{kind}", "flow": "f", "task": "t""#);
        refused_only(&file(LABEL, &run), "triggers[0].run.task");
    }
}

#[test]
fn a_folder_is_an_absolute_path() {
    for good in ["/", "/srv/repo", "/srv/my repo/ü"] {
        let run = format!(r#""kind": "local", "flow": "f", "task": "t", "folder": "{good}""#);
        assert_eq!(run_of(&file(CRON, &run)).folder.as_deref(), Some(good));
    }
    for bad in [
        json_str(""),
        json_str("srv/repo"),
        json_str("~/repo"),
        json_str("./repo"),
        json_str("/srv/\u{0}x"),
        json_str("/srv/\nx"),
        "[\"/srv\"]".to_owned(),
    ] {
        let run = format!(r#""kind": "local", "flow": "f", "task": "t", "folder": {bad}"#);
        refused_only(&file(CRON, &run), "triggers[0].run.folder");
    }
}

#[test]
fn a_task_is_text_of_at_most_10000_characters() {
    let long = "t".repeat(MAX_TASK_CHARS);
    for good in ["Tidy up.\nThen report.\n", &long] {
        let run = format!(
            r#""kind": "local", "flow": "f", "folder": "/r", "task": {}"#,
            json_str(good)
        );
        assert_eq!(run_of(&file(CRON, &run)).task.as_deref(), Some(good));
    }
    for bad in [
        json_str(""),
        json_str("\n\n"),
        json_str(&format!("{long}t")),
        json_str("a\u{0}b"),
        "1".to_owned(),
    ] {
        let run = format!(r#""kind": "local", "flow": "f", "folder": "/r", "task": {bad}"#);
        refused_only(&file(CRON, &run), "triggers[0].run.task");
    }
}

// ---------------------------------------------------------------------------------------------
// run.mcp

#[test]
fn the_specs_first_example_reads_with_its_secrets_profile() {
    let text = r#"{"triggers": [{
      "on": { "type": "label", "any": ["docs"] },
      "run": { "kind": "github", "flow": "answer", "mcp": ["docs"], "secrets": { "DOCS_TOKEN": "op://ci/docs/token" }, "secretsProfile": "ci" }
    }]}"#;
    let t = ok(text).triggers.remove(0);
    assert_eq!(
        t.on,
        On::Label {
            any: vec!["docs".into()],
            all: vec![],
            none: vec![]
        }
    );
    assert_eq!(t.run.kind, Kind::Github);
    assert_eq!(t.run.action, Action::Flow("answer".into()));
    let docs = McpName::Server(crate::mcp::ServerName::parse("docs").unwrap());
    assert_eq!(t.run.mcp, Some(vec![docs]));
    assert_eq!(
        t.run.secrets,
        [("DOCS_TOKEN".to_owned(), "op://ci/docs/token".to_owned())]
    );
    assert_eq!(t.run.secrets_profile.as_deref(), Some("ci"));
}

#[test]
fn the_specs_first_example_as_printed_is_accepted_with_the_default_profile() {
    let text = r#"{"triggers": [{
      "on": { "type": "label", "any": ["docs"] },
      "run": { "kind": "github", "flow": "answer", "mcp": ["docs"], "secrets": { "DOCS_TOKEN": "op://ci/docs/token" } }
    }]}"#;
    let t = parse_triggers(text.as_bytes()).unwrap();
    assert_eq!(
        t.triggers[0].run.secrets_profile.as_deref(),
        Some(DEFAULT_SECRETS_PROFILE)
    );
}

#[test]
fn the_specs_forge_example_reads() {
    let text = r#"{"triggers": [{
      "on": { "type": "label", "any": ["pi"] },
      "run": { "kind": "github", "flow": "fix", "mcp": ["forge", "docs"] }
    }]}"#;
    let mcp = run_of(text).mcp.unwrap();
    assert_eq!(mcp.len(), 2);
    assert_eq!(mcp[0], McpName::Forge);
    assert_eq!(mcp[0].as_str(), "forge");
    assert_eq!(mcp[1].as_str(), "docs");
    assert_eq!(mcp[1].to_string(), "docs");
}

#[test]
fn no_mcp_field_is_no_server() {
    assert_eq!(run_of(&file(LABEL, GITHUB)).mcp, None);
}

#[test]
fn mcp_not_an_array_is_refused() {
    for bad in [r#""docs""#, "{}", "null", "true"] {
        refused_only(&github(&format!(r#""mcp": {bad}"#)), "triggers[0].run.mcp");
    }
}

#[test]
fn mcp_empty_is_refused() {
    let m = refused_only(&github(r#""mcp": []"#), "triggers[0].run.mcp");
    assert!(m.contains("leave the field out"), "{m}");
}

#[test]
fn mcp_of_more_than_8_names_is_refused() {
    let names = |n: usize| {
        (0..n)
            .map(|i| format!(r#""s{i}""#))
            .collect::<Vec<_>>()
            .join(", ")
    };
    assert_eq!(
        run_of(&github(&format!(r#""mcp": [{}]"#, names(8))))
            .mcp
            .map(|m| m.len()),
        Some(8)
    );
    let m = refused_only(
        &github(&format!(r#""mcp": [{}]"#, names(9))),
        "triggers[0].run.mcp",
    );
    assert!(m.contains('8'), "{m}");
}

#[test]
fn mcp_duplicate_is_refused() {
    refused_only(
        &github(r#""mcp": ["docs", "files", "docs"]"#),
        "triggers[0].run.mcp[2]",
    );
    refused_only(
        &github(r#""mcp": ["forge", "forge"]"#),
        "triggers[0].run.mcp[1]",
    );
}

#[test]
fn mcp_name_of_the_wrong_shape_is_refused() {
    for bad in ["", "Docs", "my_docs", "a--b", "-a", "a b", &"a".repeat(33)] {
        refused_only(
            &github(&format!(r#""mcp": ["ok", "{bad}"]"#)),
            "triggers[0].run.mcp[1]",
        );
    }
    ok(&github(&format!(r#""mcp": ["{}"]"#, "a".repeat(32))));
}

#[test]
fn mcp_name_holding_dispatch_is_refused() {
    for bad in ["dispatch", "pi-dispatch", "mydispatcher"] {
        let m = refused_only(
            &github(&format!(r#""mcp": ["{bad}"]"#)),
            "triggers[0].run.mcp[0]",
        );
        assert!(m.contains("'dispatch'"), "{m}");
    }
}

#[test]
fn mcp_non_string_is_refused() {
    for bad in ["1", "null", r#"["docs"]"#, r#"{"name": "docs"}"#] {
        refused_only(
            &github(&format!(r#""mcp": ["docs", {bad}]"#)),
            "triggers[0].run.mcp[1]",
        );
    }
}

#[test]
fn mcp_forge_is_refused_on_a_cron_local_job() {
    let m = refused_only(
        &local(r#""mcp": ["docs", "forge"]"#),
        "triggers[0].run.mcp[1]",
    );
    assert!(m.contains("only for github and gitlab jobs"), "{m}");
    // Overlay servers are fine on a local job.
    ok(&local(r#""mcp": ["docs"]"#));
}

#[test]
fn mcp_forge_is_refused_on_forgejo() {
    let m = refused_only(
        &file(LABEL, r#""kind": "forgejo", "flow": "f", "mcp": ["forge"]"#),
        "triggers[0].run.mcp[0]",
    );
    assert!(m.contains("only for github and gitlab jobs"), "{m}");
    ok(&file(
        LABEL,
        r#""kind": "forgejo", "flow": "f", "mcp": ["docs"]"#,
    ));
}

#[test]
fn mcp_forge_is_refused_on_azure() {
    let m = refused_only(
        &file(LABEL, r#""kind": "azure", "flow": "f", "mcp": ["forge"]"#),
        "triggers[0].run.mcp[0]",
    );
    assert!(m.contains("only for github and gitlab jobs"), "{m}");
    ok(&file(
        LABEL,
        r#""kind": "azure", "flow": "f", "mcp": ["docs"]"#,
    ));
}

#[test]
fn mcp_forge_is_accepted_on_github_and_gitlab() {
    for kind in ["github", "gitlab"] {
        let run = run_of(&file(
            LABEL,
            &format!(r#""kind": "{kind}", "flow": "f", "mcp": ["forge"]"#),
        ));
        assert_eq!(run.mcp, Some(vec![McpName::Forge]));
    }
    assert!(Kind::Github.allows_forge_mcp() && Kind::Gitlab.allows_forge_mcp());
    assert!(
        !Kind::Local.allows_forge_mcp()
            && !Kind::Forgejo.allows_forge_mcp()
            && !Kind::Azure.allows_forge_mcp()
    );
}

// ---------------------------------------------------------------------------------------------
// run.secrets and run.secretsProfile

const PROFILE: &str = r#""secretsProfile": "ci""#;

#[test]
fn secrets_read_in_file_order() {
    let run = run_of(&github(&format!(
        r#""secrets": {{"B_TOKEN": "op://b", "A": "vault:kv/a#x", "_X1": "r"}}, {PROFILE}"#
    )));
    assert_eq!(
        run.secrets,
        [
            ("B_TOKEN".to_owned(), "op://b".to_owned()),
            ("A".to_owned(), "vault:kv/a#x".to_owned()),
            ("_X1".to_owned(), "r".to_owned()),
        ]
    );
    assert_eq!(run.secrets_profile.as_deref(), Some("ci"));
    assert!(run_of(&file(LABEL, GITHUB)).secrets.is_empty());
}

#[test]
fn secrets_is_an_object_of_1_to_16() {
    refused_only(
        &github(&format!(r#""secrets": [], {PROFILE}"#)),
        "triggers[0].run.secrets",
    );
    refused_only(
        &github(&format!(r#""secrets": "A", {PROFILE}"#)),
        "triggers[0].run.secrets",
    );
    let m = refused_only(
        &github(&format!(r#""secrets": {{}}, {PROFILE}"#)),
        "triggers[0].run.secrets",
    );
    assert!(m.contains("leave the field out"), "{m}");
    let entries = |n: usize| {
        (0..n)
            .map(|i| format!(r#""S{i}": "r""#))
            .collect::<Vec<_>>()
            .join(", ")
    };
    ok(&github(&format!(
        r#""secrets": {{{}}}, {PROFILE}"#,
        entries(16)
    )));
    refused_only(
        &github(&format!(r#""secrets": {{{}}}, {PROFILE}"#, entries(17))),
        "triggers[0].run.secrets",
    );
}

#[test]
fn secret_names_are_variable_names() {
    for bad in ["a", "Token", "1A", "A-B", "A B", ""] {
        let m = refused_only(
            &github(&format!(r#""secrets": {{"{bad}": "r"}}, {PROFILE}"#)),
            "triggers[0].run.secrets",
        );
        assert!(m.contains("variable name"), "{m}");
    }
}

#[test]
fn secret_references_are_one_short_line() {
    let long = "r".repeat(MAX_SECRET_REFERENCE_CHARS);
    ok(&github(&format!(
        r#""secrets": {{"A": "{long}"}}, {PROFILE}"#
    )));
    for bad in [
        json_str(""),
        json_str(" "),
        json_str("op://a\nop://b"),
        json_str(&format!("{long}r")),
        "1".to_owned(),
        "null".to_owned(),
        r#"{"ref": "x"}"#.to_owned(),
    ] {
        refused_only(
            &github(&format!(r#""secrets": {{"A": {bad}}}, {PROFILE}"#)),
            "triggers[0].run.secrets.A",
        );
    }
}

#[test]
fn reserved_secret_names_are_refused() {
    let mut reserved: Vec<String> = RESERVED_SECRET_NAMES
        .iter()
        .map(|s| s.to_string())
        .collect();
    reserved.extend(PROXY_VARIABLES.iter().map(|s| s.to_string()));
    reserved.extend(PROXY_VARIABLES.iter().map(|s| s.to_ascii_lowercase()));
    reserved.extend(
        [
            "Https_Proxy",
            "PI_",
            "PI_MODEL",
            "PI_DISPATCH_RUNNER_PID",
            "PI_X",
        ]
        .map(String::from),
    );
    for name in reserved {
        assert!(is_reserved_secret_name(&name), "{name}");
        let m = refused_only(
            &github(&format!(r#""secrets": {{"{name}": "r"}}, {PROFILE}"#)),
            &format!("triggers[0].run.secrets.{name}"),
        );
        assert!(m.contains("cannot bind"), "{name}: {m}");
    }
    assert_eq!(RESERVED_SECRET_NAMES.len() + PROXY_VARIABLES.len(), 16);
    for free in [
        "DOCS_TOKEN",
        "GITHUB_TOKENS",
        "PIX",
        "P_I",
        "HOMEDIR",
        "GH_HOSTNAME",
        "HF_TOKEN",
    ] {
        assert!(!is_reserved_secret_name(free), "{free}");
        ok(&github(&format!(
            r#""secrets": {{"{free}": "r"}}, {PROFILE}"#
        )));
    }
}

#[test]
fn a_profile_needs_secrets() {
    refused_only(&github(PROFILE), "triggers[0].run.secretsProfile");
}

#[test]
fn secrets_profiles_are_names() {
    for good in ["ci", "team-2", &"p".repeat(32)] {
        ok(&github(&format!(
            r#""secrets": {{"A": "r"}}, "secretsProfile": "{good}""#
        )));
    }
    for bad in [
        r#""""#,
        r#""CI""#,
        r#""a_b""#,
        "1",
        &format!(r#""{}""#, "p".repeat(33)),
    ] {
        refused_only(
            &github(&format!(
                r#""secrets": {{"A": "r"}}, "secretsProfile": {bad}"#
            )),
            "triggers[0].run.secretsProfile",
        );
    }
}

// ---------------------------------------------------------------------------------------------
// run.provider, model, models

#[test]
fn provider_model_and_models_read() {
    let run = run_of(&github(
        r#""provider": "anthropic", "model": "claude-sonnet-4.5", "models": ["anthropic/claude-sonnet-4.5", "openrouter/meta/llama-3"]"#,
    ));
    assert_eq!(run.provider.as_deref(), Some("anthropic"));
    assert_eq!(run.model.as_deref(), Some("claude-sonnet-4.5"));
    assert_eq!(
        run.models,
        Some(vec![
            "anthropic/claude-sonnet-4.5".into(),
            "openrouter/meta/llama-3".into()
        ])
    );
    // A provider alone, and a list alone, are fine.
    ok(&github(r#""provider": "openai""#));
    ok(&github(r#""models": ["openai/gpt-5"]"#));
    // Without a list, any model of the provider.
    ok(&github(
        r#""provider": "openai", "model": "gpt 5 (preview)""#,
    ));
}

#[test]
fn providers_are_names() {
    for bad in [r#""""#, r#""OpenAI""#, r#""open_ai""#, r#""a/b""#, "1"] {
        refused_only(
            &github(&format!(r#""provider": {bad}"#)),
            "triggers[0].run.provider",
        );
    }
}

#[test]
fn a_model_is_one_short_line() {
    let long = "m".repeat(MAX_MODEL_CHARS);
    ok(&github(&format!(r#""provider": "p", "model": "{long}""#)));
    for bad in [
        json_str(""),
        json_str(" "),
        json_str("a\nb"),
        json_str(&format!("{long}m")),
        "1".to_owned(),
    ] {
        refused_only(
            &github(&format!(r#""provider": "p", "model": {bad}"#)),
            "triggers[0].run.model",
        );
    }
}

#[test]
fn a_model_without_a_provider_is_refused() {
    refused_only(&github(r#""model": "gpt-5""#), "triggers[0].run.model");
}

#[test]
fn models_is_a_list_of_1_to_16_distinct_provider_models() {
    let list = |n: usize| {
        (0..n)
            .map(|i| format!(r#""p/m{i}""#))
            .collect::<Vec<_>>()
            .join(", ")
    };
    ok(&github(&format!(r#""models": [{}]"#, list(16))));
    refused_only(
        &github(&format!(r#""models": [{}]"#, list(17))),
        "triggers[0].run.models",
    );
    refused_only(&github(r#""models": []"#), "triggers[0].run.models");
    refused_only(&github(r#""models": "p/m""#), "triggers[0].run.models");
    refused_only(
        &github(r#""models": ["p/m", "q/n", "p/m"]"#),
        "triggers[0].run.models[2]",
    );
    for bad in [
        json_str("p"),
        json_str("p/"),
        json_str("/m"),
        json_str("P/m"),
        json_str("p_q/m"),
        json_str("p/m x"),
        json_str("p/m\tx"),
        json_str("p/m\u{7}"),
        "1".to_owned(),
    ] {
        refused_only(
            &github(&format!(r#""models": ["ok/m", {bad}]"#)),
            "triggers[0].run.models[1]",
        );
    }
}

#[test]
fn provider_and_model_must_be_on_the_models_list() {
    ok(&github(
        r#""provider": "p", "model": "m", "models": ["q/n", "p/m"]"#,
    ));
    refused_only(
        &github(r#""provider": "p", "model": "m", "models": ["q/n", "p/n"]"#),
        "triggers[0].run.model",
    );
}

// ---------------------------------------------------------------------------------------------
// run.maxCostUsd, excludeTools, image

#[test]
fn max_cost_is_a_number_above_0_up_to_10000() {
    for (good, value) in [
        ("0.01", 0.01),
        ("1", 1.0),
        ("10000", 10_000.0),
        ("2.5e1", 25.0),
    ] {
        assert_eq!(
            run_of(&github(&format!(r#""maxCostUsd": {good}"#))).max_cost_usd,
            Some(value)
        );
    }
    for bad in [
        "0", "-1", "10000.01", "1e9", r#""5""#, "true", "null", "[5]",
    ] {
        refused_only(
            &github(&format!(r#""maxCostUsd": {bad}"#)),
            "triggers[0].run.maxCostUsd",
        );
    }
}

#[test]
fn exclude_tools_is_a_list_of_1_to_64_distinct_tool_names() {
    let run = run_of(&github(
        r#""excludeTools": ["bash", "codemode", "tool_search", "list_mcp_resources", "read_mcp_resource", "mcp__docs__search", "mcp__*", "a.b-c"]"#,
    ));
    assert_eq!(run.exclude_tools.len(), 8);
    assert_eq!(run.exclude_tools[0], "bash");
    let list = |n: usize| {
        (0..n)
            .map(|i| format!(r#""t{i}""#))
            .collect::<Vec<_>>()
            .join(", ")
    };
    ok(&github(&format!(r#""excludeTools": [{}]"#, list(64))));
    refused_only(
        &github(&format!(r#""excludeTools": [{}]"#, list(65))),
        "triggers[0].run.excludeTools",
    );
    refused_only(
        &github(r#""excludeTools": []"#),
        "triggers[0].run.excludeTools",
    );
    refused_only(
        &github(r#""excludeTools": "bash""#),
        "triggers[0].run.excludeTools",
    );
    refused_only(
        &github(r#""excludeTools": ["bash", "bash"]"#),
        "triggers[0].run.excludeTools[1]",
    );
    let long = "t".repeat(MAX_TOOL_CHARS);
    ok(&github(&format!(r#""excludeTools": ["{long}"]"#)));
    for bad in [
        json_str(""),
        json_str(&format!("{long}t")),
        json_str("bash tool"),
        json_str("a/b"),
        json_str("ü"),
        json_str("a\n"),
        "1".to_owned(),
    ] {
        refused_only(
            &github(&format!(r#""excludeTools": ["ok", {bad}]"#)),
            "triggers[0].run.excludeTools[1]",
        );
    }
}

#[test]
fn images_are_names() {
    for good in ["pi", "pi-job", "pi_job.2", &"i".repeat(MAX_IMAGE_CHARS)] {
        assert_eq!(
            run_of(&github(&format!(r#""image": "{good}""#)))
                .image
                .as_deref(),
            Some(good)
        );
    }
    for bad in [
        r#""""#,
        r#""Pi""#,
        r#""pi:latest""#,
        r#""ghcr.io/pi""#,
        r#""pi..job""#,
        r#""-pi""#,
        r#""pi-""#,
        "1",
        &format!(r#""{}""#, "i".repeat(MAX_IMAGE_CHARS + 1)),
    ] {
        refused_only(
            &github(&format!(r#""image": {bad}"#)),
            "triggers[0].run.image",
        );
    }
}

#[test]
fn a_full_local_job_reads() {
    let run = run_of(&local(
        r#""mcp": ["docs"], "secrets": {"DOCS_TOKEN": "op://ci/docs"}, "secretsProfile": "ci", "provider": "p", "model": "m", "models": ["p/m"], "maxCostUsd": 2, "excludeTools": ["bash"], "image": "pi-job""#,
    ));
    assert_eq!(run.max_cost_usd, Some(2.0));
    assert_eq!(run.exclude_tools, ["bash"]);
    assert_eq!(run.image.as_deref(), Some("pi-job"));
    assert_eq!(run.models, Some(vec!["p/m".to_owned()]));
}

// ---------------------------------------------------------------------------------------------
// Unknown keys and near misses

#[test]
fn an_unknown_run_key_is_refused() {
    let m = refused_only(
        &github(r#""mcpServers": ["docs"]"#),
        "triggers[0].run.mcpServers",
    );
    assert!(!m.contains("did you mean"), "{m}");
    for key in ["timeout", "env", "allowPackageRunner", "on", "type"] {
        refused_only(
            &github(&format!(r#""{key}": 1"#)),
            &format!("triggers[0].run.{key}"),
        );
    }
}

#[test]
fn a_near_miss_names_the_field_probably_meant() {
    for (key, meant) in [
        ("excludetools", "excludeTools"),
        ("exclude_tools", "excludeTools"),
        ("exclude-tools", "excludeTools"),
        ("excludeTool", "excludeTools"),
        ("maxCost", "maxCostUsd"),
        ("max_cost_usd", "maxCostUsd"),
        ("secret", "secrets"),
        ("MCP", "mcp"),
        ("secrets_profile", "secretsProfile"),
        ("secretProfile", "secretsProfile"),
        ("Kind", "kind"),
        ("modle", "model"),
        ("imgae", "image"),
    ] {
        let m = refused_only(
            &github(&format!(r#""{key}": "zqxcanary""#)),
            &format!("triggers[0].run.{key}"),
        );
        assert!(m.contains(&format!("'{meant}'")), "{key}: {m}");
        assert!(!m.contains("zqxcanary"), "{m}");
    }
    // Near misses in `on`, in a trigger and at the top.
    let m = refused_only(
        &file(r#""type": "label", "Any": ["a"], "all": ["b"]"#, GITHUB),
        "triggers[0].on.Any",
    );
    assert!(m.contains("'any'"), "{m}");
    let text =
        format!(r#"{{"triggers": [{{"on": {{{LABEL}}}, "run": {{{GITHUB}}}, "Run": {{}}}}]}}"#);
    let m = refused_only(&text, "triggers[0].Run");
    assert!(m.contains("'run'"), "{m}");
    let m = refused_only(r#"{"triggers": [], "trigger": []}"#, "trigger");
    assert!(m.contains("'triggers'"), "{m}");
}

#[test]
fn a_key_that_is_not_plain_is_not_printed() {
    let m = refused_only(&github(r#""zqx canary \u001b": 1"#), "triggers[0].run");
    assert!(!m.contains("canary"), "{m}");
    refused_only(
        &github(&format!(r#""secrets": {{"PI_\u001bzqx": "r"}}, {PROFILE}"#)),
        "triggers[0].run.secrets",
    );
}

#[test]
fn near_miss_rules() {
    let known = RUN_KEYS;
    assert_eq!(near_miss("mcpServers", &known), None);
    assert_eq!(near_miss("id", &known), None);
    assert_eq!(near_miss("x", &known), None);
    assert_eq!(near_miss("mcps", &known), Some("mcp"));
    assert_eq!(near_miss("secret", &known), Some("secrets"));
    assert_eq!(near_miss(&"x".repeat(100), &known), None);
    assert_eq!(edit_distance(&['a', 'b'], &['b', 'a']), 2);
    assert_eq!(edit_distance(&[], &['a']), 1);
}

// ---------------------------------------------------------------------------------------------
// Values never appear in messages

const CANARY: &str = "zqxcanary";

/// Asserts that `text` is refused with an error at `path` and that no message says the canary.
fn refused_quietly(text: &str, path: &str) {
    assert!(text.contains(CANARY), "the case holds no canary: {text}");
    let err = parse(text).unwrap_err();
    let shown = format!("{err} {err:?}").to_lowercase();
    assert!(!shown.contains(CANARY), "{text}\n{shown}");
    assert!(
        err.errors().iter().any(|e| e.path == path),
        "{text}\nno error at {path}: {err}"
    );
}

#[test]
fn no_message_quotes_a_value() {
    let c = CANARY;
    let long = |n: usize| format!("{c}{}", "x".repeat(n));
    let cases: Vec<(String, &str)> = vec![
        // on
        (
            file(&format!(r#""type": "{c}""#), GITHUB),
            "triggers[0].on.type",
        ),
        (
            file(
                &format!(r#""type": "cron", "id": "{c}_X", "pattern": "* * * * *""#),
                LOCAL,
            ),
            "triggers[0].on.id",
        ),
        (
            files(&[
                (
                    &format!(r#""type": "cron", "id": "{c}", "pattern": "* * * * *""#),
                    LOCAL,
                ),
                (
                    &format!(r#""type": "cron", "id": "{c}", "pattern": "* * * * *""#),
                    LOCAL,
                ),
            ]),
            "triggers[1].on.id",
        ),
        (
            file(
                &format!(r#""type": "cron", "id": "n", "pattern": "{c}$ * * * *""#),
                LOCAL,
            ),
            "triggers[0].on.pattern",
        ),
        (
            file(&format!(r#""type": "label", "any": ["{c}\n"]"#), GITHUB),
            "triggers[0].on.any[0]",
        ),
        (
            file(
                &format!(r#""type": "label", "any": ["{}"]"#, long(MAX_LABEL_CHARS)),
                GITHUB,
            ),
            "triggers[0].on.any[0]",
        ),
        (
            file(
                &format!(r#""type": "label", "all": ["{c}", "{c}"]"#),
                GITHUB,
            ),
            "triggers[0].on.all[1]",
        ),
        (
            file(
                &format!(r#""type": "label", "any": ["{c}"], "none": ["{c}"]"#),
                GITHUB,
            ),
            "triggers[0].on.none[0]",
        ),
        (
            file(&format!(r#""type": "label", "none": ["{c}"]"#), GITHUB),
            "triggers[0].on",
        ),
        (
            file(
                &format!(r#""type": "comment", "phrase": "{c}\u0007""#),
                GITHUB,
            ),
            "triggers[0].on.phrase",
        ),
        (
            file(
                &format!(
                    r#""type": "comment", "phrase": "{}""#,
                    long(MAX_PHRASE_CHARS)
                ),
                GITHUB,
            ),
            "triggers[0].on.phrase",
        ),
        (
            file(&format!(r#""type": "issue", "action": "{c}""#), GITHUB),
            "triggers[0].on.action",
        ),
        (
            file(
                &format!(r#""type": "pull_request", "action": "{c}""#),
                GITHUB,
            ),
            "triggers[0].on.action",
        ),
        (
            file(&format!(r#"{LABEL}, "phrase": "{c}""#), GITHUB),
            "triggers[0].on.phrase",
        ),
        (
            file(&format!(r#"{LABEL}, "extra": "{c}""#), GITHUB),
            "triggers[0].on.extra",
        ),
        // run
        (
            file(LABEL, &format!(r#""kind": "{c}", "flow": "f""#)),
            "triggers[0].run.kind",
        ),
        (
            file(CRON, &format!(r#""kind": "github", "flow": "{c}""#)),
            "triggers[0].run.kind",
        ),
        (
            file(
                LABEL,
                &format!(r#""kind": "local", "flow": "{c}", "folder": "/{c}", "task": "{c}""#),
            ),
            "triggers[0].run.kind",
        ),
        (
            file(LABEL, &format!(r#""kind": "github", "flow": "{c}_X""#)),
            "triggers[0].run.flow",
        ),
        (
            file(
                LABEL,
                &format!(r#""kind": "github", "flow": "{c}", "command": "{c}""#),
            ),
            "triggers[0].run",
        ),
        (
            file(LABEL, &format!(r#""kind": "github", "command": "{c}\n""#)),
            "triggers[0].run.command",
        ),
        (
            file(
                LABEL,
                &format!(
                    r#""kind": "github", "command": "{}""#,
                    long(MAX_COMMAND_CHARS)
                ),
            ),
            "triggers[0].run.command",
        ),
        (
            file(
                CRON,
                &format!(r#""kind": "local", "flow": "f", "folder": "{c}", "task": "t""#),
            ),
            "triggers[0].run.folder",
        ),
        (
            file(
                CRON,
                &format!(
                    r#""kind": "local", "flow": "f", "folder": "/r", "task": "{}""#,
                    long(MAX_TASK_CHARS)
                ),
            ),
            "triggers[0].run.task",
        ),
        (
            file(
                CRON,
                &format!(r#""kind": "local", "flow": "{c}", "task": "{c}""#),
            ),
            "triggers[0].run.folder",
        ),
        (
            github(&format!(r#""folder": "/{c}""#)),
            "triggers[0].run.folder",
        ),
        (github(&format!(r#""task": "{c}""#)), "triggers[0].run.task"),
        (github(&format!(r#""mcp": "{c}""#)), "triggers[0].run.mcp"),
        (
            github(&format!(r#""mcp": ["{c}_X"]"#)),
            "triggers[0].run.mcp[0]",
        ),
        (
            github(&format!(r#""mcp": ["{c}-dispatch"]"#)),
            "triggers[0].run.mcp[0]",
        ),
        (
            github(&format!(r#""mcp": ["{c}", "{c}"]"#)),
            "triggers[0].run.mcp[1]",
        ),
        (
            github(&format!(
                r#""mcp": ["{c}", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8"]"#
            )),
            "triggers[0].run.mcp",
        ),
        (
            file(
                LABEL,
                &format!(r#""kind": "azure", "flow": "{c}", "mcp": ["forge", "{c}"]"#),
            ),
            "triggers[0].run.mcp[0]",
        ),
        (
            github(&format!(r#""secrets": "{c}", {PROFILE}"#)),
            "triggers[0].run.secrets",
        ),
        (
            github(&format!(r#""secrets": {{"A": "{c}\n"}}, {PROFILE}"#)),
            "triggers[0].run.secrets.A",
        ),
        (
            github(&format!(
                r#""secrets": {{"A": "{}"}}, {PROFILE}"#,
                long(MAX_SECRET_REFERENCE_CHARS)
            )),
            "triggers[0].run.secrets.A",
        ),
        (
            github(&format!(r#""secrets": {{"{c}": "{c}"}}, {PROFILE}"#)),
            "triggers[0].run.secrets",
        ),
        (
            github(&format!(r#""secrets": {{"HOME": "{c}"}}, {PROFILE}"#)),
            "triggers[0].run.secrets.HOME",
        ),
        (
            github(&format!(r#""secretsProfile": "{c}""#)),
            "triggers[0].run.secretsProfile",
        ),
        (
            github(&format!(
                r#""secrets": {{"A": "{c}"}}, "secretsProfile": "{c}_X""#
            )),
            "triggers[0].run.secretsProfile",
        ),
        (
            github(&format!(r#""provider": "{c}_X""#)),
            "triggers[0].run.provider",
        ),
        (
            github(&format!(r#""model": "{c}""#)),
            "triggers[0].run.model",
        ),
        (
            github(&format!(r#""provider": "p", "model": "{c}\n""#)),
            "triggers[0].run.model",
        ),
        (
            github(&format!(
                r#""provider": "{c}", "model": "{c}", "models": ["{c}/x"]"#
            )),
            "triggers[0].run.model",
        ),
        (
            github(&format!(r#""models": ["{c}"]"#)),
            "triggers[0].run.models[0]",
        ),
        (
            github(&format!(r#""models": ["{c}/a", "{c}/a"]"#)),
            "triggers[0].run.models[1]",
        ),
        (
            github(&format!(r#""models": "{c}""#)),
            "triggers[0].run.models",
        ),
        (
            github(&format!(r#""maxCostUsd": "{c}""#)),
            "triggers[0].run.maxCostUsd",
        ),
        (
            github(&format!(r#""excludeTools": ["{c} x"]"#)),
            "triggers[0].run.excludeTools[0]",
        ),
        (
            github(&format!(r#""excludeTools": ["{c}", "{c}"]"#)),
            "triggers[0].run.excludeTools[1]",
        ),
        (
            github(&format!(r#""image": "{c}/x""#)),
            "triggers[0].run.image",
        ),
        (
            github(&format!(r#""maxCost": "{c}""#)),
            "triggers[0].run.maxCost",
        ),
        (
            github(&format!(r#""mcpServers": "{c}""#)),
            "triggers[0].run.mcpServers",
        ),
        // the trigger and the file
        (format!(r#"{{"triggers": ["{c}"]}}"#), "triggers[0]"),
        (format!(r#"{{"triggers": "{c}"}}"#), "triggers"),
        (format!(r#"{{"triggers": [], "extra": "{c}"}}"#), "extra"),
        (format!(r#"["{c}"]"#), ""),
    ];
    for (text, path) in &cases {
        refused_quietly(text, path);
    }
    // Nor when the file cannot be read as JSON at all.
    for text in [
        format!(r#"{{"triggers": ["{c}" oops]}}"#),
        format!(r#"{{"triggers": [], "x": "{c}", "x": "{c}"}}"#),
    ] {
        let err = parse(&text).unwrap_err();
        assert!(!err.to_string().contains(CANARY), "{err}");
    }
}

#[test]
fn a_canary_in_every_string_field_stays_out_of_every_message() {
    let c = CANARY;
    // Every string field holds the canary, each valid, beside one error per trigger.
    let text = files(&[
        (
            &format!(r#""type": "cron", "id": "{c}", "pattern": "{c} * * * *""#),
            &format!(
                r#""kind": "local", "command": "{c}", "folder": "/{c}", "task": "{c}", "mcp": ["{c}"], "secrets": {{"A": "{c}"}}, "secretsProfile": "{c}", "provider": "{c}", "model": "{c}", "models": ["{c}/{c}"], "excludeTools": ["{c}"], "image": "{c}", "maxCostUsd": 0"#
            ),
        ),
        (
            &format!(r#""type": "label", "any": ["{c}"], "all": ["{c}1"], "none": ["{c}2"]"#),
            &format!(r#""kind": "github", "flow": "{c}", "image": "{c}!""#),
        ),
        (
            &format!(r#""type": "comment", "phrase": "{c}""#),
            &format!(r#""kind": "gitlab", "flow": "{c}", "mcp": []"#),
        ),
    ]);
    let err = parse(&text).unwrap_err();
    let paths: Vec<&str> = err.errors().iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "triggers[0].on.pattern",
            "triggers[0].run.maxCostUsd",
            "triggers[1].run.image",
            "triggers[2].run.mcp"
        ]
    );
    let shown = format!("{err} {err:?}").to_lowercase();
    assert!(!shown.contains(CANARY), "{shown}");
    // And the same file with the errors mended is accepted, canaries and all.
    let mended = text
        .replace(&format!(r#""{c} * * * *""#), r#""* * * * *""#)
        .replace(r#""maxCostUsd": 0"#, r#""maxCostUsd": 1"#)
        .replace(&format!(r#""{c}!""#), &format!(r#""{c}""#))
        .replace(r#""mcp": []"#, r#""mcp": ["forge"]"#);
    assert_eq!(ok(&mended).triggers.len(), 3);
}

#[test]
fn an_mcp_pattern_pi_could_never_match_is_refused() {
    refused_only(
        &github(r#""excludeTools": ["mcp__docs-v2__*"]"#),
        "triggers[0].run.excludeTools[0]",
    );
    let ok = parse_triggers(
        github(r#""excludeTools": ["mcp__docs_v2__*", "read_mcp_resource", "bash"]"#).as_bytes(),
    );
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn names_the_overlay_does_not_offer_are_found_by_trigger_and_place() {
    let triggers = parse(
        r#"{"triggers": [
            {"on": {"type": "label", "any": ["a"]}, "run": {"kind": "github", "flow": "f", "mcp": ["forge", "docs", "gone"]}},
            {"on": {"type": "label", "any": ["b"]}, "run": {"kind": "github", "flow": "f"}},
            {"on": {"type": "label", "any": ["c"]}, "run": {"kind": "github", "flow": "f", "mcp": ["off", "bad", "docs"]}}
        ]}"#,
    )
    .unwrap();
    let overlay = crate::mcp::parse_overlay(
        br#"{"mcpServers": {
            "docs": {"url": "https://h.example.com/mcp", "description": "d"},
            "off": {"url": "https://h.example.com/mcp", "description": "d", "enabled": false},
            "bad": {"url": "https://h.example.com/mcp"}
        }}"#,
    )
    .unwrap();
    assert!(triggers.names_overlay_servers());
    let found: Vec<(String, &str, NotOffered)> = triggers
        .unoffered(&overlay)
        .into_iter()
        .map(|u| (u.path, u.name.as_str(), u.why))
        .collect();
    assert_eq!(
        found,
        [
            (
                "triggers[0].run.mcp[2]".to_owned(),
                "gone",
                NotOffered::Missing
            ),
            (
                "triggers[2].run.mcp[0]".to_owned(),
                "off",
                NotOffered::TurnedOff
            ),
            (
                "triggers[2].run.mcp[1]".to_owned(),
                "bad",
                NotOffered::Refused
            ),
        ]
    );
    // forge alone needs no overlay.
    let forge_only = parse(
        r#"{"triggers": [{"on": {"type": "label", "any": ["a"]}, "run": {"kind": "github", "flow": "f", "mcp": ["forge"]}}]}"#,
    )
    .unwrap();
    assert!(!forge_only.names_overlay_servers());
    let empty = crate::mcp::parse_overlay(br#"{"mcpServers": {}}"#).unwrap();
    assert_eq!(forge_only.unoffered(&empty), []);
}

#[test]
fn the_triggers_file_reader_says_each_outcome_by_the_files_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("triggers.json");

    let missing = TriggersFile::read(&path).unwrap();
    assert!(!missing.exists);
    assert!(missing.triggers.triggers.is_empty());
    assert_eq!(
        missing.trigger(0).unwrap_err(),
        format!("{} does not exist, so it has no trigger 0", path.display())
    );

    std::fs::write(&path, r#"{"triggers": []}"#).unwrap();
    let empty = TriggersFile::read(&path).unwrap();
    assert!(empty.exists);
    assert_eq!(
        empty.trigger(2).unwrap_err(),
        format!("{} has no trigger 2 (it has 0)", path.display())
    );

    std::fs::write(&path, r#"{"triggers": 1}"#).unwrap();
    let refused = TriggersFile::read(&path).unwrap_err();
    assert_eq!(refused.code(), "triggers-invalid");
    let text = refused.to_string();
    assert!(
        text.starts_with(&format!("{} is refused: ", path.display())),
        "{text}"
    );
    assert_eq!(text.matches("refused").count(), 1, "{text}");
    assert!(!refused.may_pass_on_retry());

    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink(dir.path().join("elsewhere"), &path).unwrap();
    let link = TriggersFile::read(&path).unwrap_err();
    assert_eq!(link.code(), "file-link");
    assert!(link.to_string().starts_with(&path.display().to_string()));
}

/// The `(path, message)` of every error of `text`, in the order found.
fn found(text: &str) -> Vec<(String, String)> {
    errors(text)
        .into_iter()
        .map(|e| (e.path, e.message))
        .collect()
}

#[test]
fn every_field_of_a_run_wrong_at_once_is_reported_in_the_order_read() {
    let text = file(
        LABEL,
        r#""kind": "github", "flow": "Bad Flow", "command": 5, "folder": "/x", "task": "t",
            "mcp": ["forge", "forge"], "secrets": {"a": "x"}, "secretsProfile": "Bad",
            "provider": "Bad", "model": 5, "models": ["x"], "maxCostUsd": "x",
            "excludeTools": ["mcp__a-b", "b c"], "image": "A", "labels": ["Bad"],
            "sameIssue": "x", "extra": 1"#,
    );
    let want = [
        ("run.extra", "a key pi-dispatch does not know"),
        (
            "run.flow",
            "a flow is lowercase letters and digits, words joined by single '-', at most 64 characters",
        ),
        ("run.command", "must be a string, not a number"),
        ("run", "a run has either 'flow' or 'command', not both"),
        (
            "run.folder",
            "'folder' is only for local jobs; a github job does nothing with it",
        ),
        (
            "run.task",
            "'task' is only for local jobs; a github job does nothing with it",
        ),
        ("run.mcp[1]", "names the same server as mcp[0]"),
        (
            "run.secrets",
            "a key of secrets is not a variable name: uppercase letters, digits and '_', not starting with a digit",
        ),
        (
            "run.secretsProfile",
            "a secrets profile is lowercase letters and digits, words joined by single '-', at most 32 characters",
        ),
        (
            "run.provider",
            "a provider is lowercase letters and digits, words joined by single '-'",
        ),
        ("run.model", "must be a string, not a number"),
        (
            "run.models[0]",
            "an entry is PROVIDER/MODEL: a provider name, '/', and a model without spaces or control characters",
        ),
        (
            "run.maxCostUsd",
            "must be a number of US dollars more than 0 and at most 10000, not a string",
        ),
        (
            "run.excludeTools[0]",
            "pi writes MCP tool names with '_' for every other character (mcp__my_server__tool): this pattern would match nothing",
        ),
        (
            "run.excludeTools[1]",
            "a tool name or pattern is 1 to 128 characters of letters, digits, '_', '.', '*' and '-'",
        ),
        (
            "run.image",
            "an image is lowercase letters and digits, words joined by single '.', '_' or '-', at most 64 characters",
        ),
        (
            "run.labels[0]",
            "a label is 1 to 63 lowercase letters, digits, '.', '_' and '-', or two such words joined by ':' (zone:eu)",
        ),
        ("run.sameIssue", "must be \"wait\" or \"cancel-older\""),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(p, m)| (format!("triggers[0].{p}"), (*m).to_owned()))
        .collect();
    assert_eq!(found(&text), want);
}

#[test]
fn a_run_s_rules_between_fields_are_reported_in_the_order_read() {
    let cases: [(String, &[(&str, &str)]); 5] = [
        (
            file(
                CRON,
                r#""kind": "local", "sameIssue": "wait", "secretsProfile": "ci", "model": "m", "maxCostUsd": 0"#,
            ),
            &[
                ("run", "a run needs a 'flow' or a 'command'"),
                ("run.folder", "a local job needs 'folder'"),
                ("run.task", "a local job needs 'task'"),
                (
                    "run.secretsProfile",
                    "a secretsProfile without 'secrets' does nothing; leave it out",
                ),
                ("run.model", "a model needs a provider: give 'provider' too"),
                (
                    "run.maxCostUsd",
                    "must be a number of US dollars more than 0 and at most 10000",
                ),
                (
                    "run.sameIssue",
                    "'sameIssue' is only for forge jobs; a local job has no issue",
                ),
            ],
        ),
        (
            file(
                CRON,
                r#""kind": "github", "flow": "fix", "provider": "p", "model": "m", "models": ["p/other"]"#,
            ),
            &[
                (
                    "run.kind",
                    "a cron trigger runs a local job: a cron job holds no forge token",
                ),
                (
                    "run.model",
                    "provider/model is not on the trigger's 'models' list",
                ),
            ],
        ),
        (
            file(
                LABEL,
                r#""kind": "local", "command": "make", "folder": "rel", "task": 5"#,
            ),
            &[
                ("run.kind", "a local job is started by a cron trigger only"),
                (
                    "run.folder",
                    "a folder is an absolute path (starting with '/') without control characters",
                ),
                ("run.task", "must be a string, not a number"),
            ],
        ),
        (
            file(LABEL, r#""kind": "svn", "flow": "fix""#),
            &[(
                "run.kind",
                "must be local, github, gitlab, forgejo or azure",
            )],
        ),
        (
            file(LABEL, r#""flow": "fix""#),
            &[(
                "run.kind",
                "a run needs a kind: local, github, gitlab, forgejo or azure",
            )],
        ),
    ];
    for (text, want) in cases {
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(p, m)| (format!("triggers[0].{p}"), (*m).to_owned()))
            .collect();
        assert_eq!(found(&text), want, "{text}");
    }
}

#[test]
fn every_field_of_a_run_lands_in_its_place() {
    let run = run_of(&file(
        LABEL,
        r#""kind": "github", "flow": "fix", "mcp": ["forge", "docs"],
            "secrets": {"DOCS_TOKEN": "op://ci/docs/token"}, "secretsProfile": "ci",
            "provider": "anthropic", "model": "claude-x",
            "models": ["anthropic/claude-x", "openai/gpt-x"], "maxCostUsd": 2.5,
            "excludeTools": ["bash", "mcp__docs__*"], "image": "pi-job.v2",
            "labels": ["gpu", "zone:eu"], "sameIssue": "cancel-older", "pins": "accept""#,
    ));
    let want = Run {
        kind: Kind::Github,
        action: Action::Flow("fix".to_owned()),
        folder: None,
        task: None,
        mcp: Some(vec![
            McpName::Forge,
            McpName::Server(ServerName::parse("docs").unwrap()),
        ]),
        secrets: vec![("DOCS_TOKEN".to_owned(), "op://ci/docs/token".to_owned())],
        secrets_profile: Some("ci".to_owned()),
        provider: Some("anthropic".to_owned()),
        model: Some("claude-x".to_owned()),
        models: Some(vec![
            "anthropic/claude-x".to_owned(),
            "openai/gpt-x".to_owned(),
        ]),
        max_cost_usd: Some(2.5),
        exclude_tools: vec!["bash".to_owned(), "mcp__docs__*".to_owned()],
        image: Some("pi-job.v2".to_owned()),
        labels: vec!["gpu".to_owned(), "zone:eu".to_owned()],
        same_issue: SameIssue::CancelOlder,
        pins: PinPolicy::Accept,
    };
    assert_eq!(run, want);
    let local = run_of(&file(
        CRON,
        r#""kind": "local", "command": "make check", "folder": "/srv/repo", "task": "Tidy up",
            "secrets": {"DOCS_TOKEN": "op://ci/docs/token"}"#,
    ));
    assert_eq!(
        (
            local.kind,
            local.action,
            local.folder.as_deref(),
            local.task.as_deref(),
            local.secrets_profile.as_deref(),
            local.mcp,
            local.same_issue,
        ),
        (
            Kind::Local,
            Action::Command("make check".to_owned()),
            Some("/srv/repo"),
            Some("Tidy up"),
            Some(DEFAULT_SECRETS_PROFILE),
            None,
            SameIssue::Wait,
        )
    );
}

#[test]
fn a_runs_pin_policy_is_one_of_three_words_and_withholds_by_default() {
    for (policy, want) in [
        ("withhold", PinPolicy::Withhold),
        ("refuse", PinPolicy::Refuse),
        ("accept", PinPolicy::Accept),
    ] {
        let run = run_of(&file(CRON, &format!(r#"{LOCAL}, "pins": "{policy}""#)));
        assert_eq!(run.pins, want);
    }
    assert_eq!(run_of(&file(CRON, LOCAL)).pins, PinPolicy::Withhold);
    for wrong in [r#""Accept""#, r#""off""#, "true", "[]"] {
        refused_only(
            &file(CRON, &format!(r#"{LOCAL}, "pins": {wrong}"#)),
            "triggers[0].run.pins",
        );
    }
}
