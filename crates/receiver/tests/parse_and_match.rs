#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The events as the forges send them, read and matched: pure functions, no server.

use config::triggers::parse_triggers;
use protocol::forge_event::{Forge, ForgeEvent, comment_mark};
use receiver::matching::{jobs_for, matches};
use receiver::payload::{Parsed, Unreadable};
use receiver::{github, gitlab};

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn event(parsed: Parsed) -> ForgeEvent {
    match parsed {
        Parsed::Event(e) => *e,
        other => panic!("not an event: {other:?}"),
    }
}

fn edit(name: &str, f: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(&fixture(name)).unwrap();
    f(&mut v);
    serde_json::to_vec(&v).unwrap()
}

#[test]
fn a_github_label_event_reads_as_labeled_with_the_label_added() {
    let e = event(github::parse("issues", "d-1", &fixture("github-issues-labeled.json")).unwrap());
    assert_eq!(e.forge, Forge::Github);
    assert_eq!(e.action, "labeled");
    assert_eq!(e.repository, "octo-org/hello");
    assert_eq!(e.repository_id, 1296269);
    assert_eq!(e.installation, Some(987654));
    assert_eq!((e.number, e.pull_request), (42, false));
    assert_eq!(e.labels, ["bug", "docs"]);
    assert_eq!(e.added_labels, ["docs"]);
    assert_eq!(e.default_branch, "main");
    assert_eq!(e.sender, "maintainer");
    assert!(e.body.contains("8780"));
}

#[test]
fn a_github_comment_reads_with_its_text_and_a_null_issue_body_is_empty() {
    let e = event(
        github::parse(
            "issue_comment",
            "d-2",
            &fixture("github-issue-comment.json"),
        )
        .unwrap(),
    );
    assert_eq!(e.action, "commented");
    assert_eq!(e.body, "");
    let c = e.comment.unwrap();
    assert_eq!((c.id, c.author.as_str()), (555001, "maintainer"));
    assert!(c.body.contains("/pi answer"));
    assert!(!e.pull_request);
    // On a pull request, the issue has a pull_request member.
    let on_pr = edit("github-issue-comment.json", |v| {
        v["issue"]["pull_request"] = serde_json::json!({"url": "x"});
    });
    assert!(event(github::parse("issue_comment", "d", &on_pr).unwrap()).pull_request);
}

#[test]
fn github_comments_by_bots_or_by_the_worker_and_edits_are_ignored() {
    let bot = edit("github-issue-comment.json", |v| {
        v["comment"]["user"]["type"] = "Bot".into();
    });
    assert!(matches!(
        github::parse("issue_comment", "d", &bot).unwrap(),
        Parsed::Ignored(_)
    ));
    let ours = edit("github-issue-comment.json", |v| {
        v["comment"]["body"] = format!("/pi answer\n{}", comment_mark("gh-x-t0")).into();
    });
    assert!(matches!(
        github::parse("issue_comment", "d", &ours).unwrap(),
        Parsed::Ignored(_)
    ));
    let edited = edit("github-issue-comment.json", |v| {
        v["action"] = "edited".into()
    });
    assert!(matches!(
        github::parse("issue_comment", "d", &edited).unwrap(),
        Parsed::Ignored(_)
    ));
}

#[test]
fn a_github_pull_request_has_its_head() {
    let e = event(
        github::parse(
            "pull_request",
            "d-3",
            &fixture("github-pull-request-opened.json"),
        )
        .unwrap(),
    );
    assert!(e.pull_request);
    assert_eq!((e.action.as_str(), e.number), ("opened", 7));
    let head = e.head.unwrap();
    assert_eq!(head.branch, "fix-port");
    assert!(head.same_repository);
    let fork = edit("github-pull-request-opened.json", |v| {
        v["pull_request"]["head"]["repo"]["full_name"] = "someone/hello".into();
    });
    assert!(
        !event(github::parse("pull_request", "d", &fork).unwrap())
            .head
            .unwrap()
            .same_repository
    );
}

#[test]
fn github_pings_other_events_and_other_actions() {
    assert_eq!(
        github::parse("ping", "d", b"{\"zen\":\"z\"}").unwrap(),
        Parsed::Ping
    );
    assert!(matches!(
        github::parse("push", "d", b"{}").unwrap(),
        Parsed::Ignored(_)
    ));
    let closed = edit("github-issues-labeled.json", |v| {
        v["action"] = "closed".into()
    });
    assert!(matches!(
        github::parse("issues", "d", &closed).unwrap(),
        Parsed::Ignored(_)
    ));
}

#[test]
fn an_unreadable_payload_names_the_field_never_a_value() {
    assert_eq!(
        github::parse("issues", "d", b"[1]"),
        Err(Unreadable::NotJson)
    );
    assert_eq!(
        github::parse("issues", "d", b"not json"),
        Err(Unreadable::NotJson)
    );
    let no_repo = edit("github-issues-labeled.json", |v| {
        v["repository"]["full_name"] = 5.into();
    });
    let err = github::parse("issues", "d", &no_repo).unwrap_err();
    assert_eq!(err, Unreadable::Missing("/repository/full_name"));
    assert!(err.to_string().contains("/repository/full_name"));
    let secret_title = edit("github-issues-labeled.json", |v| {
        v["issue"]["title"] = serde_json::json!({"canary": "CANARY-TITLE"});
    });
    let err = github::parse("issues", "d", &secret_title).unwrap_err();
    assert!(!err.to_string().contains("CANARY"));
}

#[test]
fn gitlab_events_read_in_the_triggers_words() {
    let e =
        event(gitlab::parse("Issue Hook", "u-1", &fixture("gitlab-issue-labeled.json")).unwrap());
    assert_eq!(e.forge, Forge::Gitlab);
    assert_eq!(e.action, "labeled");
    assert_eq!(e.repository, "group/sub/hello");
    assert_eq!((e.repository_id, e.number), (15, 23));
    assert_eq!(e.added_labels, ["docs"]);
    assert_eq!(e.installation, None);
    // An update that adds no label is an edit; open and reopen are opened and reopened.
    let edited = edit("gitlab-issue-labeled.json", |v| {
        v.as_object_mut().unwrap().remove("changes");
    });
    assert_eq!(
        event(gitlab::parse("Issue Hook", "u", &edited).unwrap()).action,
        "edited"
    );
    let opened = edit("gitlab-issue-labeled.json", |v| {
        v["object_attributes"]["action"] = "open".into();
        v.as_object_mut().unwrap().remove("changes");
    });
    assert_eq!(
        event(gitlab::parse("Issue Hook", "u", &opened).unwrap()).action,
        "opened"
    );
    let closed = edit("gitlab-issue-labeled.json", |v| {
        v["object_attributes"]["action"] = "close".into();
    });
    assert!(matches!(
        gitlab::parse("Issue Hook", "u", &closed).unwrap(),
        Parsed::Ignored(_)
    ));
    let confidential = edit("gitlab-issue-labeled.json", |v| {
        v["object_attributes"]["confidential"] = true.into();
    });
    assert!(matches!(
        gitlab::parse("Issue Hook", "u", &confidential).unwrap(),
        Parsed::Ignored(_)
    ));

    let note =
        event(gitlab::parse("Note Hook", "u-2", &fixture("gitlab-note-on-issue.json")).unwrap());
    assert_eq!(
        (note.action.as_str(), note.number, note.pull_request),
        ("commented", 23, false)
    );
    assert_eq!(note.comment.as_ref().unwrap().id, 1244);
    let system = edit("gitlab-note-on-issue.json", |v| {
        v["object_attributes"]["system"] = true.into();
    });
    assert!(matches!(
        gitlab::parse("Note Hook", "u", &system).unwrap(),
        Parsed::Ignored(_)
    ));

    let mr = event(
        gitlab::parse(
            "Merge Request Hook",
            "u-3",
            &fixture("gitlab-merge-request-opened.json"),
        )
        .unwrap(),
    );
    assert_eq!(
        (mr.action.as_str(), mr.number, mr.pull_request),
        ("opened", 4, true)
    );
    assert_eq!(mr.body, "");
    assert_eq!(mr.head.unwrap().branch, "fix-port");
    let pushed = edit("gitlab-merge-request-opened.json", |v| {
        v["object_attributes"]["action"] = "update".into();
        v["object_attributes"]["oldrev"] = "abc".into();
    });
    assert_eq!(
        event(gitlab::parse("Merge Request Hook", "u", &pushed).unwrap()).action,
        "synchronize"
    );
    assert!(matches!(
        gitlab::parse("Push Hook", "u", b"{}").unwrap(),
        Parsed::Ignored(_)
    ));
}

const TRIGGERS: &str = r#"{"triggers": [
  {"on": {"type": "label", "any": ["docs"]}, "run": {"kind": "github", "flow": "answer"}},
  {"on": {"type": "label", "all": ["docs", "bug"], "none": ["wontfix"]}, "run": {"kind": "github", "flow": "fix"}},
  {"on": {"type": "comment", "phrase": "/pi answer"}, "run": {"kind": "github", "flow": "answer"}},
  {"on": {"type": "issue", "action": "opened"}, "run": {"kind": "gitlab", "flow": "answer"}},
  {"on": {"type": "pull_request", "action": "opened"}, "run": {"kind": "github", "flow": "answer"}},
  {"on": {"type": "label", "any": ["docs"]}, "run": {"kind": "gitlab", "flow": "answer"}},
  {"on": {"type": "cron", "id": "nightly", "pattern": "0 3 * * *"},
   "run": {"kind": "local", "flow": "task", "folder": "/srv/r", "task": "t"}}
]}"#;

fn indexes(triggers: &config::triggers::Triggers, e: &ForgeEvent) -> Vec<usize> {
    triggers
        .triggers
        .iter()
        .filter(|t| matches(t, e))
        .map(|t| t.index)
        .collect()
}

#[test]
fn each_event_starts_exactly_the_triggers_it_matches() {
    let triggers = parse_triggers(TRIGGERS.as_bytes()).unwrap();
    let labeled =
        event(github::parse("issues", "d", &fixture("github-issues-labeled.json")).unwrap());
    // docs added to an issue labelled bug: the any trigger and the all trigger.
    assert_eq!(indexes(&triggers, &labeled), [0, 1]);
    // wontfix on it too: only the any trigger.
    let mut wontfix = labeled.clone();
    wontfix.labels.push("wontfix".into());
    assert_eq!(indexes(&triggers, &wontfix), [0]);
    // A label that matches nothing.
    let mut other = labeled.clone();
    other.added_labels = vec!["question".into()];
    other.labels = vec!["question".into()];
    assert!(indexes(&triggers, &other).is_empty());
    // An unrelated label added to an issue that already has docs starts nothing.
    let mut unrelated = labeled.clone();
    unrelated.added_labels = vec!["question".into()];
    assert!(indexes(&triggers, &unrelated).is_empty());
    // The comment with the phrase; without it, nothing.
    let comment =
        event(github::parse("issue_comment", "d", &fixture("github-issue-comment.json")).unwrap());
    assert_eq!(indexes(&triggers, &comment), [2]);
    let mut plain = comment.clone();
    plain.comment.as_mut().unwrap().body = "thanks!".into();
    assert!(indexes(&triggers, &plain).is_empty());
    // A pull request opened; an issue trigger of GitHub's does not take it.
    let pr = event(
        github::parse(
            "pull_request",
            "d",
            &fixture("github-pull-request-opened.json"),
        )
        .unwrap(),
    );
    assert_eq!(indexes(&triggers, &pr), [4]);
    // GitLab's label event starts GitLab's trigger only.
    let gl =
        event(gitlab::parse("Issue Hook", "u", &fixture("gitlab-issue-labeled.json")).unwrap());
    assert_eq!(indexes(&triggers, &gl), [5]);
    let jobs = jobs_for(&triggers, &labeled);
    assert_eq!(
        jobs.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        ["gh-d-t0", "gh-d-t1"]
    );
    assert!(jobs.iter().all(|j| j.event.as_ref() == Some(&labeled)));
    assert_eq!(jobs[1].flow.as_deref(), Some("fix"));
    assert_eq!(jobs[0].trigger_type, "label");
}

/// A value for each `run` key on a github label trigger; the keys only a local job has are
/// refused on it. A key the loader learns without a value here fails the test.
fn sample(key: &str) -> Option<serde_json::Value> {
    use serde_json::json;
    Some(match key {
        "kind" => json!("github"),
        "flow" => json!("answer"),
        "command" => json!("make check"),
        "mcp" => json!(["forge", "docs"]),
        "secrets" => json!({"DOCS_TOKEN": "op://ci/docs/token"}),
        "secretsProfile" => json!("ci"),
        "provider" => json!("openai"),
        "model" => json!("gpt-4o-mini"),
        "models" => json!(["openai/gpt-4o-mini", "anthropic/claude-x"]),
        "maxCostUsd" => json!(2.5),
        "excludeTools" => json!(["bash", "mcp__docs__*"]),
        "image" => json!("pi-job"),
        "labels" => json!(["gpu", "zone:eu"]),
        "sameIssue" => json!("cancel-older"),
        "pins" => json!("refuse"),
        "folder" | "task" => return None,
        other => panic!("run.{other} has no sample here: add one, and make sure jobs carry it"),
    })
}

#[test]
fn a_queued_job_carries_every_run_field_as_the_loader_normalized_it() {
    use serde_json::json;
    let keys = config::triggers::RUN_KEYS;
    // flow and command exclude each other: one trigger with each.
    let run_with = |action: &str| {
        let mut run = serde_json::Map::new();
        for key in keys {
            if matches!(key, "flow" | "command") && key != action {
                continue;
            }
            if let Some(v) = sample(key) {
                run.insert(key.to_owned(), v);
            }
        }
        run
    };
    let file = json!({"triggers": [
        {"on": {"type": "label", "any": ["docs"]}, "run": run_with("flow")},
        {"on": {"type": "label", "any": ["docs"]}, "run": run_with("command")},
    ]});
    let triggers = parse_triggers(file.to_string().as_bytes()).unwrap();
    let labeled =
        event(github::parse("issues", "d", &fixture("github-issues-labeled.json")).unwrap());
    let jobs = jobs_for(&triggers, &labeled);
    assert_eq!(jobs.len(), 2);
    for (job, trigger) in jobs.iter().zip(&triggers.triggers) {
        // What the worker reads back from the queue.
        let queued: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(job).unwrap()).unwrap();
        let back: protocol::Job = serde_json::from_value(queued.clone()).unwrap();
        assert_eq!(&back, job);
        for key in keys {
            let Some(sample) = sample(key) else {
                continue;
            };
            let given = file["triggers"][trigger.index]["run"].get(key);
            let Some(given) = given else {
                assert!(queued.get(key).is_none(), "run.{key} appeared from nowhere");
                continue;
            };
            assert_eq!(given, &sample);
            // Not a field of the job: the queue's placement of the delivery's first job.
            if key == "sameIssue" {
                continue;
            }
            let expected = match key {
                // Only the names of secrets are queued; their references stay in the file.
                "secrets" => json!(["DOCS_TOKEN"]),
                _ => sample.clone(),
            };
            assert_eq!(
                queued.get(key),
                Some(&expected),
                "run.{key} was lost on the way to the queue"
            );
        }
    }
    // The labels are what a worker needs, and the delivery's first job supersedes the issue's
    // older jobs; all are in the issue's group.
    let placed = receiver::matching::queued(&triggers, &labeled).unwrap();
    assert_eq!(
        placed
            .iter()
            .map(|j| j.placement.supersede)
            .collect::<Vec<_>>(),
        [true, false]
    );
    for job in &placed {
        assert_eq!(job.placement.needs, ["gpu", "zone:eu"]);
        assert_eq!(
            job.placement.group.as_deref(),
            Some(format!("github:{}#{}", labeled.repository, labeled.number).as_str())
        );
    }
    // The keys only a local job has are refused on a forge trigger, so none is lost.
    for key in ["folder", "task"] {
        assert!(keys.contains(&key));
        let mut run = run_with("flow");
        run.insert(key.to_owned(), json!("/srv/r"));
        let file = json!({"triggers": [{"on": {"type": "label", "any": ["docs"]}, "run": run}]});
        assert!(
            parse_triggers(file.to_string().as_bytes()).is_err(),
            "run.{key} on a forge trigger"
        );
    }
}
