//! The records' index, as every backend must keep it: written once, found newest first by every
//! filter and page after page, pruned oldest first without lowering a counter.

use super::{RedisStore, SqliteStore, Store};
use crate::records::{Cursor, RecordEntry, RecordFilter, RecordIndex, RecordKeys};

fn keys(at: u64, outcome: &str, reason: Option<&str>) -> RecordKeys {
    RecordKeys {
        finished_at_ms: at,
        outcome: outcome.to_owned(),
        reason: reason.map(str::to_owned),
        trigger_index: Some(0),
        trigger_type: "cron".to_owned(),
        repo: None,
        folder: Some("/srv/a".to_owned()),
    }
}

fn put(index: &dyn RecordIndex, id: &str, k: &RecordKeys) -> bool {
    let counts = [(format!("jobs{{outcome=\"{}\"}}", k.outcome), 1.0)];
    index
        .put_record(&RecordEntry {
            id,
            text: &format!("{{\"id\":\"{id}\"}}"),
            keys: k,
            counts: &counts,
        })
        .unwrap()
}

fn ids(index: &dyn RecordIndex, filter: &RecordFilter, limit: usize) -> Vec<String> {
    index
        .find_records(filter, None, limit)
        .unwrap()
        .into_iter()
        .map(|f| f.id)
        .collect()
}

pub(crate) fn a_record_is_stored_once_and_counted_once(store: &dyn Store) {
    let index = store.index();
    assert!(put(&*index, "a", &keys(10, "completed", None)));
    assert!(!put(&*index, "a", &keys(99, "failed", Some("time-limit"))));
    assert_eq!(
        index.get_record("a").unwrap().as_deref(),
        Some("{\"id\":\"a\"}")
    );
    assert_eq!(index.get_record("b").unwrap(), None);
    assert_eq!(
        index.counters().unwrap(),
        [("jobs{outcome=\"completed\"}".to_owned(), 1.0)]
    );
    assert_eq!(index.count_records().unwrap(), 1);
    // Another handle sees it.
    assert_eq!(ids(&*store.index(), &RecordFilter::default(), 10), ["a"]);
}

pub(crate) fn records_are_found_newest_first_by_every_filter(store: &dyn Store) {
    let index = store.index();
    let mut forge = keys(30, "failed", Some("time-limit"));
    forge.repo = Some("octo/hello".into());
    forge.folder = None;
    forge.trigger_type = "label".into();
    forge.trigger_index = Some(1);
    put(&*index, "a", &keys(10, "completed", None));
    put(&*index, "b", &keys(20, "failed", Some("time-limit")));
    put(&*index, "gh", &forge);
    put(
        &*index,
        "c",
        &keys(40, "policy", Some("mcp-server-unknown")),
    );
    // Two as old as each other: the greater id first.
    put(&*index, "d1", &keys(40, "completed", None));
    let all = RecordFilter::default();
    assert_eq!(ids(&*index, &all, 10), ["d1", "c", "gh", "b", "a"]);
    assert_eq!(ids(&*index, &all, 2), ["d1", "c"]);
    let f = |edit: &dyn Fn(&mut RecordFilter)| {
        let mut filter = RecordFilter::default();
        edit(&mut filter);
        ids(&*index, &filter, 10)
    };
    assert_eq!(f(&|f| f.outcome = Some("failed".into())), ["gh", "b"]);
    assert_eq!(f(&|f| f.reason = Some(None)), ["d1", "a"]);
    assert_eq!(
        f(&|f| f.reason = Some(Some("time-limit".into()))),
        ["gh", "b"]
    );
    assert_eq!(f(&|f| f.repo = Some("octo/hello".into())), ["gh"]);
    assert_eq!(
        f(&|f| f.folder = Some("/srv/a".into())),
        ["d1", "c", "b", "a"]
    );
    assert_eq!(f(&|f| f.trigger_index = Some(1)), ["gh"]);
    assert_eq!(
        f(&|f| f.trigger_type = Some("cron".into())),
        ["d1", "c", "b", "a"]
    );
    assert_eq!(f(&|f| f.since_ms = Some(30)), ["d1", "c", "gh"]);
    // Every condition must hold.
    assert_eq!(
        f(&|f| {
            f.outcome = Some("completed".into());
            f.folder = Some("/srv/a".into());
            f.since_ms = Some(20);
        }),
        ["d1"]
    );
    assert_eq!(
        f(&|f| f.outcome = Some("cancelled".into())),
        Vec::<String>::new()
    );
}

pub(crate) fn pages_follow_each_other_without_a_gap_or_a_repeat(store: &dyn Store) {
    let index = store.index();
    // Three records a millisecond: ties are ordered by id.
    let mut want = Vec::new();
    for i in 0..31u64 {
        let id = format!("job-{i:02}");
        put(&*index, &id, &keys(100 + i / 3, "completed", None));
        want.push(id);
    }
    want.reverse();
    for filter in [
        RecordFilter::default(),
        RecordFilter {
            outcome: Some("completed".into()),
            ..RecordFilter::default()
        },
    ] {
        let mut got = Vec::new();
        let mut after: Option<Cursor> = None;
        loop {
            let page = index.find_records(&filter, after.as_ref(), 4).unwrap();
            assert!(page.len() <= 4);
            let Some(last) = page.last() else { break };
            after = Some(last.cursor());
            got.extend(page.into_iter().map(|f| f.id));
        }
        assert_eq!(got, want);
    }
}

pub(crate) fn pruning_removes_the_oldest_and_keeps_the_counters(store: &dyn Store) {
    let index = store.index();
    for i in 0..10u64 {
        put(
            &*index,
            &format!("r{i}"),
            &keys(i * 10, "failed", Some("time-limit")),
        );
    }
    let counters = index.counters().unwrap();
    assert_eq!(index.count_records_before(45).unwrap(), 5);
    // Bounded: at most three a pass, oldest first.
    assert_eq!(index.prune_records(45, 3).unwrap(), ["r0", "r1", "r2"]);
    assert_eq!(index.prune_records(45, 3).unwrap(), ["r3", "r4"]);
    assert!(index.prune_records(45, 3).unwrap().is_empty());
    assert_eq!(index.count_records().unwrap(), 5);
    assert_eq!(index.get_record("r4").unwrap(), None);
    let reason = RecordFilter {
        reason: Some(Some("time-limit".into())),
        ..RecordFilter::default()
    };
    assert_eq!(ids(&*index, &reason, 100), ["r9", "r8", "r7", "r6", "r5"]);
    assert_eq!(index.counters().unwrap(), counters);
    // A pruned id is a new record again (a job id is never reused; nothing stops it).
    assert!(put(&*index, "r0", &keys(1000, "completed", None)));
}

pub(crate) fn many_records_are_stored_in_one_step_each_once(store: &dyn Store) {
    let index = store.index();
    put(&*index, "r1", &keys(1, "completed", None));
    let k: Vec<RecordKeys> = (0..1200)
        .map(|i| keys(i, "failed", Some("time-limit")))
        .collect();
    let names: Vec<String> = (0..1200).map(|i| format!("r{i}")).collect();
    let counts = [("jobs".to_owned(), 1.0)];
    let entries: Vec<RecordEntry<'_>> = names
        .iter()
        .zip(&k)
        .map(|(id, keys)| RecordEntry {
            id,
            text: "{}",
            keys,
            counts: &counts,
        })
        .collect();
    // r1 was stored already: every other is stored now, and counted once.
    assert_eq!(index.put_records(&entries).unwrap(), 1199);
    assert_eq!(index.put_records(&entries).unwrap(), 0);
    assert_eq!(index.count_records().unwrap(), 1200);
    // When each ended, without the texts: newest first, by the filter.
    let times = index.find_times(&RecordFilter::default(), 3).unwrap();
    assert_eq!(times, [1199, 1198, 1197]);
    let counters = index.counters().unwrap();
    assert!(
        counters.contains(&("jobs".to_owned(), 1199.0)),
        "{counters:?}"
    );
    let failed = RecordFilter {
        reason: Some(Some("time-limit".into())),
        ..RecordFilter::default()
    };
    assert_eq!(ids(&*index, &failed, 2000).len(), 1199);
}

suite!(
    many_records_are_stored_in_one_step_each_once,
    a_record_is_stored_once_and_counted_once,
    records_are_found_newest_first_by_every_filter,
    pages_follow_each_other_without_a_gap_or_a_repeat,
    pruning_removes_the_oldest_and_keeps_the_counters,
);

#[test]
fn sqlite_has_no_records_to_index_again() {
    let store = SqliteStore::new();
    assert!(store.index().unindexed_records(10).unwrap().is_empty());
}

#[test]
fn redis_records_from_before_the_index_are_handed_over_once() {
    let store = RedisStore::new();
    let redis = store.redis();
    redis
        .call("plant", |c| {
            redis::cmd("SET")
                .arg("pi-dispatch:record:old")
                .arg("{\"old\":1}")
                .query::<()>(c)?;
            redis::cmd("ZADD")
                .arg("pi-dispatch:records")
                .arg(5)
                .arg("old")
                .query::<()>(c)
        })
        .unwrap();
    assert_eq!(
        redis.unindexed_records(10).unwrap(),
        [("old".to_owned(), Some("{\"old\":1}".to_owned()))]
    );
    let k = keys(5, "failed", Some("worker-lost"));
    let counts = [("jobs".to_owned(), 1.0)];
    let entry = RecordEntry {
        id: "old",
        text: "ignored: the stored text stays",
        keys: &k,
        counts: &counts,
    };
    // Indexed now, its text as it was; not stored again.
    assert!(!redis.put_record(&entry).unwrap());
    assert!(redis.unindexed_records(10).unwrap().is_empty());
    assert!(!redis.put_record(&entry).unwrap());
    assert_eq!(redis.counters().unwrap(), [("jobs".to_owned(), 1.0)]);
    let found = redis
        .find_records(
            &RecordFilter {
                reason: Some(Some("worker-lost".into())),
                ..RecordFilter::default()
            },
            None,
            5,
        )
        .unwrap();
    assert_eq!(found[0].text.as_deref(), Some("{\"old\":1}"));
}

#[test]
fn a_redis_search_goes_on_past_what_one_call_looks_at() {
    let store = RedisStore::new();
    let redis = store.redis();
    // The one record the filter finds is older than the 6,000 others.
    put(&redis, "rare", &keys(1, "cancelled", Some("cancelled")));
    for i in 0..6_000u64 {
        put(&redis, &format!("n{i}"), &keys(10 + i, "completed", None));
    }
    let filter = RecordFilter {
        outcome: Some("cancelled".into()),
        folder: Some("/srv/a".into()),
        ..RecordFilter::default()
    };
    // The outcome's zset is walked; with a folder's first, the walk must span calls.
    assert_eq!(ids(&redis, &filter, 5), ["rare"]);
}
