//! The records' behaviour on every store: each test runs once on the SQLite file and once on a
//! real Redis (Debian's redis-server, started by the test).

use std::sync::Arc;

use protocol::job::Job;

use super::*;
use crate::query::{Query, ReasonIs};
use crate::record::{Outcome, Reason};

/// A fresh, empty store of one backend.
pub(crate) trait Backend {
    fn open(&self) -> Records;
    /// Stores `text` under `id` as a version without the index did, when the backend had
    /// records then (Redis); false when it had not.
    fn plant_unindexed(&self, id: &str, text: &str, at: u64) -> bool;
}

pub(crate) struct Sqlite(tempfile::TempDir);

impl Backend for Sqlite {
    fn open(&self) -> Records {
        Records::sqlite(&self.0.path().join("state/queue.sqlite3")).unwrap()
    }

    fn plant_unindexed(&self, _: &str, _: &str, _: u64) -> bool {
        false
    }
}

pub(crate) struct Redis(testkit::redis::RedisServer);

impl Backend for Redis {
    fn open(&self) -> Records {
        let target = queue::RedisTarget {
            url: self.0.url(),
            password: None,
        };
        Records::redis(Arc::new(queue::RedisQueue::open(&target).unwrap()))
    }

    fn plant_unindexed(&self, id: &str, text: &str, at: u64) -> bool {
        self.0
            .command(&["SET", &format!("pi-dispatch:record:{id}"), text]);
        self.0
            .command(&["ZADD", "pi-dispatch:records", &at.to_string(), id]);
        true
    }
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(#[test] fn $name() {
                super::$name(&super::Sqlite(tempfile::tempdir().unwrap()))
            })*
        }
        mod on_redis {
            $(#[test] fn $name() {
                super::$name(&super::Redis(testkit::redis::RedisServer::start()))
            })*
        }
    };
}

suite!(
    a_record_is_written_once_read_back_and_seen_by_every_handle,
    what_cannot_be_read_as_a_record_is_reported_not_skipped,
    queries_find_the_newest_first_and_every_condition_must_hold,
    a_query_pages_through_every_record,
    records_of_every_earlier_shape_are_brought_in_once_losing_nothing,
    counters_count_each_record_once_and_pruning_lowers_none,
);

fn job(id: &str) -> Job {
    let mut job = Job::new(id, "cron", "local");
    job.trigger_index = Some(1);
    job.folder = Some("/srv/repo".into());
    job
}

fn record(id: &str, outcome: Outcome, reason: Option<Reason>, at: u64) -> Record {
    Record::new(&job(id), outcome, reason, 1, at)
}

fn ids(page: &Page) -> Vec<&str> {
    page.records.iter().map(|r| r.job_id.as_str()).collect()
}

fn a_record_is_written_once_read_back_and_seen_by_every_handle(b: &dyn Backend) {
    let records = b.open();
    let first = record("job-7", Outcome::Completed, None, 10);
    assert!(records.write(&first).unwrap());
    let second = record("job-7", Outcome::Failed, Some(Reason::TimeLimit), 20);
    assert!(
        !records.write(&second).unwrap(),
        "a second record replaced the first"
    );
    assert_eq!(records.read("job-7").unwrap(), first);
    assert_eq!(b.open().read("job-7").unwrap(), first);
    assert_eq!(records.list().unwrap().records, vec![first.clone()]);
    assert!(matches!(
        records.read("../etc/passwd"),
        Err(RecordError::NotFound)
    ));
    assert!(matches!(records.read("job-8"), Err(RecordError::NotFound)));
    let mut bad = record("../x", Outcome::Completed, None, 1);
    assert!(matches!(records.write(&bad), Err(RecordError::Invalid)));
    bad.job_id = ".hidden".into();
    assert!(matches!(records.write(&bad), Err(RecordError::Invalid)));
    // A write asked again after its answer was lost (the store restarted as it answered) finds
    // its own record: written, not a second record. The control: another record of the same job
    // is refused as before.
    assert!(write_logged(&records, &first));
    assert!(!write_logged(&records, &second));
}

fn what_cannot_be_read_as_a_record_is_reported_not_skipped(b: &dyn Backend) {
    let records = b.open();
    records
        .write(&record("good", Outcome::Completed, None, 10))
        .unwrap();
    if b.plant_unindexed("broken", "{", 5) {
        let migrated = b.open().migrate(Path::new("/nonexistent")).unwrap();
        assert_eq!(migrated.unreadable, ["record broken in Redis"]);
        let listing = records.list().unwrap();
        assert_eq!(listing.unreadable, ["broken"]);
        assert_eq!(listing.records.len(), 1);
    }
    let state = tempfile::tempdir().unwrap();
    let runs = state.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    std::fs::write(runs.join("damaged.json"), "{").unwrap();
    let migrated = records.migrate(state.path()).unwrap();
    let moved = state.path().join("runs.imported");
    assert_eq!(
        migrated.unreadable,
        [runs.join("damaged.json").display().to_string()]
    );
    assert_eq!(migrated.folder.as_deref(), Some(moved.as_path()));
    // Kept where the operator can look at it.
    assert_eq!(std::fs::read(moved.join("damaged.json")).unwrap(), b"{");
}

fn queries_find_the_newest_first_and_every_condition_must_hold(b: &dyn Backend) {
    let records = b.open();
    let mut forge = record("gh-1", Outcome::Failed, Some(Reason::TimeLimit), 30);
    forge.item = Some("octo/hello#4".into());
    forge.folder = None;
    forge.trigger_type = "label".into();
    forge.trigger_index = Some(0);
    let mut mr = record("gl-1", Outcome::Completed, None, 35);
    mr.item = Some("group/project!9".into());
    mr.folder = None;
    for r in [
        record("a", Outcome::Completed, None, 10),
        record("b", Outcome::Failed, Some(Reason::TimeLimit), 20),
        forge,
        mr,
        record("c", Outcome::Policy, Some(Reason::McpServerUnknown), 40),
    ] {
        records.write(&r).unwrap();
    }
    let find = |q: Query| ids(&records.find(&q, None).unwrap()).join(" ");
    let q = Query::default;
    assert_eq!(find(q()), "c gl-1 gh-1 b a");
    assert_eq!(find(Query { limit: 2, ..q() }), "c gl-1");
    assert_eq!(
        find(Query {
            outcome: Some(Outcome::Failed),
            ..q()
        }),
        "gh-1 b"
    );
    let timed_out_locally = Query {
        reason: Some(ReasonIs::Is(Reason::TimeLimit)),
        folder: Some("/srv/repo".into()),
        ..q()
    };
    assert_eq!(find(timed_out_locally), "b");
    assert_eq!(
        find(Query {
            repo: Some("octo/hello".into()),
            ..q()
        }),
        "gh-1"
    );
    assert_eq!(
        find(Query {
            repo: Some("group/project".into()),
            ..q()
        }),
        "gl-1"
    );
    assert_eq!(
        find(Query {
            trigger: Some(Query::trigger("0")),
            ..q()
        }),
        "gh-1"
    );
    let by_type = Query {
        trigger: Some(Query::trigger("cron")),
        since_ms: Some(20),
        ..q()
    };
    assert_eq!(find(by_type), "c gl-1 b");
    assert_eq!(
        find(Query {
            reason: Some(ReasonIs::None),
            ..q()
        }),
        "gl-1 a"
    );
    assert_eq!(
        find(Query {
            outcome: Some(Outcome::Cancelled),
            ..q()
        }),
        ""
    );
}

fn a_query_pages_through_every_record(b: &dyn Backend) {
    let records = b.open();
    for i in 0..23u64 {
        // Two records a millisecond.
        records
            .write(&record(
                &format!("r{i:02}"),
                Outcome::Completed,
                None,
                100 + i / 2,
            ))
            .unwrap();
    }
    let q = Query {
        limit: 5,
        outcome: Some(Outcome::Completed),
        ..Query::default()
    };
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = records.find(&q, after.as_ref()).unwrap();
        seen.extend(ids(&page).into_iter().map(str::to_owned));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let want: Vec<String> = (0..23).rev().map(|i| format!("r{i:02}")).collect();
    assert_eq!(seen, want);
}

/// Every shape a record was ever written in (`tests/shapes`), kept as files by the versions before
/// the index, and, on Redis, as records without it.
fn records_of_every_earlier_shape_are_brought_in_once_losing_nothing(b: &dyn Backend) {
    let shapes = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shapes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&shapes)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "the shapes are missing");
    let state = tempfile::tempdir().unwrap();
    let runs = state.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    let mut want = std::collections::BTreeMap::new();
    for (i, f) in files.iter().enumerate() {
        let text = std::fs::read_to_string(f).unwrap();
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        let id = parsed["jobId"].as_str().unwrap().to_owned();
        let planted = b.plant_unindexed(
            &format!("redis-{id}"),
            &text.replace(&id, &format!("redis-{id}")),
            i as u64,
        );
        std::fs::write(runs.join(format!("{id}.json")), &text).unwrap();
        want.insert(id.clone(), parsed.clone());
        if planted {
            let redis_id = format!("redis-{id}");
            want.insert(
                redis_id,
                serde_json::from_str(&text.replace(&id, &format!("redis-{id}"))).unwrap(),
            );
        }
    }
    let records = b.open();
    let migrated = records.migrate(state.path()).unwrap();
    assert_eq!(migrated.unreadable, Vec::<String>::new());
    assert_eq!(migrated.records, want.len());
    // Once: a second start finds nothing left to bring in.
    assert_eq!(b.open().migrate(state.path()).unwrap(), Migrated::default());
    let listing = records.list().unwrap();
    assert_eq!(listing.unreadable, Vec::<String>::new());
    assert_eq!(listing.records.len(), want.len());
    for r in &listing.records {
        // Nothing lost: every value the file held is in the record as read now.
        let now = serde_json::to_value(r).unwrap();
        let old = &want[&r.job_id];
        for (key, value) in old.as_object().unwrap() {
            assert_eq!(&now[key], value, "{}: {key}", r.job_id);
        }
    }
    // Every file is still there, beside the store.
    let kept = std::fs::read_dir(state.path().join("runs.imported"))
        .unwrap()
        .count();
    assert_eq!(kept, files.len());
}

fn counters_count_each_record_once_and_pruning_lowers_none(b: &dyn Backend) {
    let records = b.open();
    for (i, reason) in [None, Some(Reason::TimeLimit), Some(Reason::TimeLimit)]
        .into_iter()
        .enumerate()
    {
        let outcome = reason.map_or(Outcome::Completed, Reason::outcome);
        records
            .write(&record(&format!("j{i}"), outcome, reason, 10 * i as u64))
            .unwrap();
    }
    records
        .write(&record("j0", Outcome::Failed, None, 99))
        .unwrap();
    let text = crate::counts::render(&records.counters().unwrap());
    let failed = "pi_dispatch_jobs_total{outcome=\"failed\",reason=\"time-limit\"} 2\n";
    assert!(text.contains(failed), "{text}");
    assert!(
        text.contains("pi_dispatch_jobs_total{outcome=\"completed\",reason=\"none\"} 1\n"),
        "{text}"
    );
    assert_eq!(records.count_before(15).unwrap(), 2);
    assert_eq!(records.prune(15, 100).unwrap(), ["j0", "j1"]);
    assert_eq!(records.count().unwrap(), 1);
    assert_eq!(crate::counts::render(&b.open().counters().unwrap()), text);
}
