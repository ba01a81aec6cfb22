use super::*;
use protocol::exit_line::{ExitLine, ServerState};
use protocol::job::Job;
use protocol::pins::{DriftKind, ServerInfo};

const ECHO: &str = r#"{"name": "echo", "description": "Echoes"}"#;
const ADD: &str = r#"{"name": "add"}"#;

fn listing(tools: &[(&str, &str)]) -> Listing {
    Listing::of(
        ServerInfo {
            name: Some("docs".into()),
            version: Some("1".into()),
        },
        tools.iter().copied(),
    )
}

/// A draft of job `job-1` whose runner reported that `docs` listed `seen` (and `wiki` nothing,
/// not ready).
fn draft(seen: Listing) -> Draft {
    draft_of("job-1", seen)
}

fn draft_of(id: &str, seen: Listing) -> Draft {
    let mut draft = Draft::new(&Job::new(id, "cli", "local"), 1);
    let state = |name: &str, listing: Option<Listing>| ServerState {
        name: name.into(),
        state: if listing.is_some() { "ready" } else { "failed" }.into(),
        ready_ms: None,
        listing,
    };
    draft.mcp_reported(&ExitLine {
        event: "exit".into(),
        job_id: id.into(),
        code: 0,
        reason: None,
        server: None,
        cause: None,
        servers: vec![state("docs", Some(seen)), state("wiki", None)],
        tool_calls: Vec::new(),
        usage: None,
        final_message: None,
    });
    draft
}

fn record_pins(draft: &Draft) -> Vec<PinReport> {
    draft.finish(records::record::Ending::completed()).mcp.pins
}

const NOW: SystemTime = SystemTime::UNIX_EPOCH;

/// Job `id`, whose `docs` listed `seen`, held to `given` under `withhold` and kept in `store`.
fn job(store: &dyn Queue, id: &str, seen: Listing, given: &BTreeMap<String, Listing>) {
    let mut d = draft_of(id, seen);
    write(
        store,
        id,
        reckon(&mut d, given, PinPolicy::Withhold, NOW),
        NOW,
    );
}

#[test]
fn a_first_listing_is_pinned_by_the_job_and_the_record_keeps_no_listing() {
    let mut d = draft(listing(&[(ECHO_NAME, ECHO)]));
    let writes = reckon(&mut d, &BTreeMap::new(), PinPolicy::Withhold, NOW);
    assert!(
        matches!(&writes[..], [Write::Pin { server, first: true, pin, approved: None }]
        if server == "docs" && pin.by == "job job-1" && pin.listing.tools.contains_key("echo"))
    );
    let record = d.finish(records::record::Ending::completed());
    assert_eq!(record.mcp.pins.len(), 1);
    assert!(record.mcp.pins[0].first_use);
    assert!(record.mcp.servers.iter().all(|s| s.listing.is_none()));
}

const ECHO_NAME: &str = "echo";

#[test]
fn a_server_that_matches_its_pin_has_nothing_to_say_or_keep() {
    let pin = listing(&[(ECHO_NAME, ECHO)]);
    let mut d = draft(pin.clone());
    let given = BTreeMap::from([("docs".to_owned(), pin)]);
    assert!(reckon(&mut d, &given, PinPolicy::Withhold, NOW).is_empty());
    assert!(record_pins(&d).is_empty());
}

#[test]
fn drift_is_noted_for_approval_or_under_accept_becomes_the_pin() {
    let given = BTreeMap::from([("docs".to_owned(), listing(&[(ECHO_NAME, ECHO)]))]);
    let seen = listing(&[(ECHO_NAME, ECHO), ("add", ADD)]);
    for policy in [PinPolicy::Withhold, PinPolicy::Refuse] {
        let mut d = draft(seen.clone());
        let writes = reckon(&mut d, &given, policy, NOW);
        assert!(
            matches!(&writes[..], [Write::Drift { server, drift }]
                if server == "docs" && drift.job_id == "job-1" && drift.listing == seen),
            "{policy:?}"
        );
        let reports = record_pins(&d);
        assert_eq!(reports[0].policy, policy);
        assert_eq!(reports[0].drift[0].tool, "add");
        assert_eq!(reports[0].drift[0].kind, DriftKind::New);
    }
    let mut d = draft(seen.clone());
    let writes = reckon(&mut d, &given, PinPolicy::Accept, NOW);
    assert!(matches!(&writes[..], [Write::Pin { first: false, pin, .. }] if pin.listing == seen));
}

#[test]
fn the_store_keeps_what_reckon_says_and_a_first_pin_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = queue::SqliteQueue::open(&dir.path().join("q.sqlite3")).unwrap();
    let seen = listing(&[(ECHO_NAME, ECHO)]);
    let mut d = draft(seen.clone());
    let writes = reckon(&mut d, &BTreeMap::new(), PinPolicy::Withhold, NOW);
    write(&store, "job-1", writes, NOW);
    assert_eq!(
        read(&store, &["docs".into(), "wiki".into()]).unwrap()["docs"],
        seen
    );
    // A second first use (another job at the same time) leaves the first pin.
    let other = listing(&[("add", ADD)]);
    job(&store, "job-2", other.clone(), &BTreeMap::new());
    assert_eq!(read(&store, &["docs".into()]).unwrap()["docs"], seen);
    // Drift is noted, and the pin stays.
    let given = BTreeMap::from([("docs".to_owned(), seen.clone())]);
    job(&store, "job-3", other, &given);
    assert_eq!(read(&store, &["docs".into()]).unwrap()["docs"], seen);
    let drifts = store.pin_drifts().unwrap();
    assert_eq!(drifts.len(), 1);
    let noted: StoredDrift = serde_json::from_str(&drifts[0].1).unwrap();
    assert_eq!(noted.job_id, "job-3");
}

/// `server`'s definitions as the runner says them: each tool's canonical text.
fn said(d: &mut Draft, server: &str, tools: &[(&str, &str)]) {
    let texts = tools
        .iter()
        .map(|(name, text)| ((*name).to_owned(), (*text).to_owned()))
        .collect();
    d.definitions_said(BTreeMap::from([(server.to_owned(), texts)]));
}

#[test]
fn only_definitions_whose_digest_the_listing_has_are_kept() {
    let echo = protocol::pins::canonical_text(ECHO).unwrap();
    let mut d = draft(listing(&[(ECHO_NAME, ECHO), ("add", ADD)]));
    // The control: echo's own text. The probe: a text for add that is not what was digested.
    said(
        &mut d,
        "docs",
        &[(ECHO_NAME, &echo), ("add", r#"{"name":"add","x":1}"#)],
    );
    let writes = reckon(&mut d, &BTreeMap::new(), PinPolicy::Withhold, NOW);
    let [Write::Pin { pin, .. }] = &writes[..] else {
        panic!("one pin");
    };
    assert_eq!(pin.definitions, BTreeMap::from([("echo".to_owned(), echo)]));
}

#[test]
fn drift_keeps_the_definitions_of_what_differs_only() {
    let given = BTreeMap::from([("docs".to_owned(), listing(&[(ECHO_NAME, ECHO)]))]);
    let mut d = draft(listing(&[(ECHO_NAME, ECHO), ("add", ADD)]));
    let echo = protocol::pins::canonical_text(ECHO).unwrap();
    let add = protocol::pins::canonical_text(ADD).unwrap();
    said(&mut d, "docs", &[(ECHO_NAME, &echo), ("add", &add)]);
    let writes = reckon(&mut d, &given, PinPolicy::Withhold, NOW);
    let [Write::Drift { drift, .. }] = &writes[..] else {
        panic!("one drift");
    };
    assert_eq!(drift.definitions, BTreeMap::from([("add".to_owned(), add)]));
}

#[test]
fn an_approval_replaces_the_pin_by_the_operator_and_says_what_differed() {
    let dir = tempfile::tempdir().unwrap();
    let store = queue::SqliteQueue::open(&dir.path().join("q.sqlite3")).unwrap();
    let first = listing(&[(ECHO_NAME, ECHO)]);
    let mut d = draft(first.clone());
    write(
        &store,
        "job-1",
        reckon(&mut d, &BTreeMap::new(), PinPolicy::Withhold, NOW),
        NOW,
    );
    let now = listing(&[(ECHO_NAME, ECHO), ("add", ADD)]);
    let given = read(&store, &["docs".into()]).unwrap();
    let d = draft_of("pin-1", now.clone());
    let writes = approve(&d, &given, "alice (mcp pin)", NOW);
    let [
        Write::Pin {
            first: false,
            approved: Some(diff),
            pin,
            ..
        },
    ] = &writes[..]
    else {
        panic!("one approval");
    };
    assert_eq!(pin.by, "alice (mcp pin)");
    assert_eq!(diff.drift[0].tool, "add");
    write(&store, "pin-1", writes, NOW);
    assert_eq!(read(&store, &["docs".into()]).unwrap()["docs"], now);
}

#[test]
fn a_pin_that_does_not_read_is_as_none_and_the_next_job_pins_the_server_anew() {
    let dir = tempfile::tempdir().unwrap();
    let store = queue::SqliteQueue::open(&dir.path().join("q.sqlite3")).unwrap();
    store
        .put_pin("docs", "{\"written by\": \"another version\"}", false, NOW)
        .unwrap();
    let given = read(&store, &["docs".into()]).unwrap();
    assert!(given.is_empty());
    let seen = listing(&[(ECHO_NAME, ECHO)]);
    let mut d = draft(seen.clone());
    write(
        &store,
        "job-1",
        reckon(&mut d, &given, PinPolicy::Withhold, NOW),
        NOW,
    );
    assert_eq!(read(&store, &["docs".into()]).unwrap()["docs"], seen);
    // The control: a pin that reads is never replaced by a first use.
    job(&store, "job-2", listing(&[("add", ADD)]), &BTreeMap::new());
    assert_eq!(read(&store, &["docs".into()]).unwrap()["docs"], seen);
}
