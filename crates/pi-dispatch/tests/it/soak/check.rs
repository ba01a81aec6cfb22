//! What the soak checks once the workers have drained, and the report it prints.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use protocol::reason::Outcome;
use records::record::Record;
use serde_json::{Value, json};

use super::faults::Ran;
use super::leftovers::{self, Leftovers};
use super::schedule::{JobKind, Plan};
use super::{ATTEMPTS, Rig};
use crate::common::Run;

/// What the soak found.
pub struct Report {
    /// Final records by outcome and reason.
    pub ends: BTreeMap<String, usize>,
    /// Records of earlier attempts.
    pub attempt_records: usize,
    /// Faults that ran, by kind.
    pub faults: BTreeMap<&'static str, usize>,
    pub leftovers: Leftovers,
    /// What the workers logged of each job that did not complete.
    pub stories: String,
    /// What each fault met, in order.
    pub notes: Vec<String>,
    /// Requests the model was sent.
    pub model_requests: usize,
    /// Every broken promise, in words.
    pub problems: Vec<String>,
}

fn end(r: &Record) -> String {
    match r.reason {
        None => r.outcome.as_str().to_owned(),
        Some(reason) => format!("{}/{}", r.outcome.as_str(), reason.as_str()),
    }
}

/// Each final record: one, of its job, with an outcome and reason that go together, a retried
/// reason only once the attempts ran out, and never `completed` for a model that never answered.
fn final_records(
    plan: &Plan,
    ids: &[String],
    records: &BTreeMap<String, Record>,
    problems: &mut Vec<String>,
) {
    for (id, kind) in ids.iter().zip(&plan.jobs) {
        let r = &records[id];
        let consistent = match r.reason {
            None => r.outcome == Outcome::Completed,
            Some(reason) => reason.outcome() == r.outcome,
        };
        if r.job_id != *id || r.attempt_of.is_some() || !consistent {
            problems.push(format!(
                "{id}: a record that is not its final one: {}",
                end(r)
            ));
        }
        if r.reason.is_some_and(|x| x.retried()) && r.attempt < ATTEMPTS {
            problems.push(format!(
                "{id}: {} on attempt {} was not tried again",
                end(r),
                r.attempt
            ));
        }
        if *kind != JobKind::Normal && r.outcome == Outcome::Completed {
            problems.push(format!(
                "{id}: completed with a model that never answered ({kind:?})"
            ));
        }
    }
}

/// Every record in the store is of a soak job (its own or an earlier attempt's), each job has one
/// final record, and the counters count each record once.
fn store(rig: &Rig, ids: &[String], problems: &mut Vec<String>) -> usize {
    let store = rig.records();
    let listing = store.list().unwrap();
    if !listing.unreadable.is_empty() {
        problems.push(format!("unreadable records: {:?}", listing.unreadable));
    }
    let known: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let mut finals: BTreeMap<&str, usize> = BTreeMap::new();
    let mut attempts = 0;
    for r in &listing.records {
        let of = r.attempt_of.as_deref().unwrap_or(&r.job_id);
        if !known.contains(of) {
            problems.push(format!("a record of no soak job: {}", r.job_id));
        }
        if r.attempt_of.is_some() {
            attempts += 1;
        } else {
            *finals.entry(of).or_default() += 1;
        }
    }
    for id in ids {
        if finals.get(id.as_str()) != Some(&1) {
            problems.push(format!("{id}: {:?} final records", finals.get(id.as_str())));
        }
    }
    let series = |all: Vec<(String, f64)>| -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (name, value) in all {
            if name.starts_with("pi_dispatch_jobs_total{") {
                *out.entry(name).or_default() += value;
            }
        }
        out
    };
    let counted = series(store.counters().unwrap());
    let expected = series(
        listing
            .records
            .iter()
            .flat_map(records::counts::of)
            .collect(),
    );
    if counted != expected {
        problems.push(format!(
            "the counters {counted:?} are not the records' {expected:?}"
        ));
    }
    attempts
}

/// Nothing open in the queue, and no record written twice by the workers.
fn queue(rig: &Rig, status: &Run, problems: &mut Vec<String>) {
    let status: Value = serde_json::from_str(&status.stdout).unwrap_or_default();
    for state in ["queued", "waiting", "waitingForHost", "running", "lost"] {
        if status["counts"][state] != 0 {
            problems.push(format!(
                "{} {state} once every job had its record",
                status["counts"][state]
            ));
        }
    }
    for (n, log) in rig.logs().iter().enumerate() {
        for id in log.ids("job_already_recorded") {
            problems.push(format!("worker {n} wrote a second record of {id}"));
        }
    }
}

/// What the workers logged of job `id` (for a job that did not complete, or a problem).
fn story(rig: &Rig, id: &str) -> String {
    let mut out = String::new();
    for (n, log) in rig.logs().iter().enumerate() {
        for v in log.0.lock().unwrap().iter() {
            if v.to_string().contains(id) {
                let mut v = v.clone();
                if let Some(o) = v.as_object_mut() {
                    o.remove("job_id");
                }
                out.push_str(&format!("    worker {n}: {v}\n"));
            }
        }
    }
    out
}

pub fn all(
    rig: &Rig,
    plan: &Plan,
    ids: &[String],
    records: &BTreeMap<String, Record>,
    ran: &[Ran],
    status: &Run,
) -> Report {
    let mut problems = Vec::new();
    final_records(plan, ids, records, &mut problems);
    let attempt_records = store(rig, ids, &mut problems);
    queue(rig, status, &mut problems);
    let mut faults: BTreeMap<&'static str, usize> = BTreeMap::new();
    for r in ran {
        *faults.entry(r.fault.kind()).or_default() += 1;
    }
    for (kind, n) in plan.tally() {
        if kind.starts_with("model-") {
            faults.insert(kind, n);
        } else if faults.get(kind).copied().unwrap_or(0) == 0 {
            problems.push(format!("no {kind} fault ran"));
        }
    }
    let mut ends: BTreeMap<String, usize> = BTreeMap::new();
    for r in records.values() {
        *ends.entry(end(r)).or_default() += 1;
    }
    let normal = plan.jobs.iter().filter(|k| **k == JobKind::Normal).count();
    let completed = ends.get("completed").copied().unwrap_or(0);
    if completed * 2 < normal {
        problems.push(format!(
            "only {completed} of {normal} ordinary jobs completed"
        ));
    }
    let mut stories = String::new();
    for (id, r) in records {
        if r.outcome != Outcome::Completed || problems.iter().any(|p| p.contains(id.as_str())) {
            stories.push_str(&format!(
                "  {id} ({}): {:?}\n{}",
                end(r),
                r.detail,
                story(rig, id)
            ));
        }
    }
    let leftovers = leftovers::find(rig.d.path(), &rig.state(), rig.backend.uids(), ids);
    if !leftovers.is_empty() {
        problems.push(format!("left on the host: {leftovers:#?}"));
    }
    Report {
        ends,
        attempt_records,
        faults,
        leftovers,
        stories,
        notes: ran
            .iter()
            .map(|r| format!("{}: {}", r.fault.kind(), r.note))
            .collect(),
        model_requests: rig.model.requests().len(),
        problems,
    }
}

impl Report {
    pub fn text(&self, backend: &str, took: Duration) -> String {
        let jobs: usize = self.ends.values().sum();
        let mut out = format!("soak on {backend}: {jobs} jobs in {} s\n", took.as_secs());
        out.push_str(&format!("  faults: {:?}\n", self.faults));
        out.push_str(&format!("  model requests: {}\n", self.model_requests));
        out.push_str(&format!(
            "  final records: {:?}; records of earlier attempts: {}\n",
            self.ends, self.attempt_records
        ));
        out.push_str(&format!(
            "  left on the host: {}\n",
            self.leftovers.summary()
        ));
        out.push_str(&self.stories);
        for p in &self.problems {
            out.push_str(&format!("  PROBLEM: {p}\n"));
        }
        out
    }

    pub fn json(&self, backend: &str, plan: &Plan, took: Duration) -> Value {
        json!({
            "backend": backend,
            "seed": plan.seed,
            "jobs": plan.jobs.len(),
            "seconds": took.as_secs(),
            "faults": self.faults,
            "faultsRan": self.notes,
            "modelRequests": self.model_requests,
            "ends": self.ends,
            "attemptRecords": self.attempt_records,
            "leftovers": self.leftovers.summary(),
            "problems": self.problems,
        })
    }

    pub fn assert_clean(&self) {
        assert!(self.problems.is_empty(), "{:#?}", self.problems);
    }
}
