//! `pi-dispatch prune`: what the keep settings let go is removed (or, with --dry-run, only
//! counted), a job without a record is left alone, and a setting that cannot hold is refused by
//! name.

use records::record::{Outcome, Record};

const DAY: u64 = 86_400_000;

fn folder(d: &crate::common::Deployment, id: &str) {
    d.write(&format!("state/jobs/{id}/transcript.jsonl"), "{}\n");
    d.write(&format!("state/jobs/{id}/workspace/README.md"), "clone\n");
}

fn left(d: &crate::common::Deployment) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(d.path().join("state/jobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn prune_removes_what_the_keep_settings_let_go_and_a_dry_run_removes_nothing() {
    let d = crate::common::Deployment::new();
    assert_eq!(d.run(&["init"]).code, 0);
    let now = records::record::now_ms();
    let store = d.records();
    for (id, days) in [("year-old", 400), ("month-old", 40), ("yesterday", 1)] {
        let job = protocol::job::Job::new(id, "cron", "local");
        store
            .write(&Record::new(
                &job,
                Outcome::Completed,
                None,
                1,
                now - days * DAY,
            ))
            .unwrap();
        folder(&d, id);
    }
    folder(&d, "still-running");
    let dry = d.run(&["prune", "--dry-run"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert!(
        dry.stdout
            .contains("Records older than 365 days: 1 would be removed"),
        "{}",
        dry.stdout
    );
    assert!(
        dry.stdout
            .contains("Transcripts older than 30 days: 2 would be removed"),
        "{}",
        dry.stdout
    );
    assert_eq!(left(&d).len(), 4);
    assert_eq!(d.record_count(), 3);

    let done = d.run(&["prune"]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert!(
        done.stdout
            .contains("Records older than 365 days: 1 removed"),
        "{}",
        done.stdout
    );
    assert_eq!(left(&d), ["still-running", "yesterday"]);
    let kept: Vec<String> = std::fs::read_dir(d.path().join("state/jobs/yesterday"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(kept, ["transcript.jsonl"]);
    assert!(
        d.path()
            .join("state/jobs/still-running/workspace/README.md")
            .exists()
    );
    assert_eq!(d.record_count(), 2);
    assert!(d.record("year-old").is_none());
    // A record whose transcript went says so.
    let mut month_old = d.record("month-old").unwrap();
    month_old["transcript"] = serde_json::json!(true);
    d.replace_record("month-old", &month_old);
    let gone = d.run(&["runs", "show", "month-old", "--transcript"]);
    assert_eq!(gone.code, 1, "{}", gone.stderr);
    assert!(gone.stderr.contains("no longer kept"), "{}", gone.stderr);

    // Transcripts kept longer than their records would be found by nothing: refused, by name.
    let env = std::fs::read_to_string(d.path().join(".env")).unwrap();
    d.write(".env", &format!("{env}\nPI_KEEP_RECORDS_DAYS=7\n"));
    let refused = d.run(&["prune"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("PI_KEEP_TRANSCRIPTS_DAYS")
            && refused.stderr.contains("PI_KEEP_RECORDS_DAYS"),
        "{}",
        refused.stderr
    );
}
