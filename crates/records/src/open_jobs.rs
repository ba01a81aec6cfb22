//! The jobs not done, as people look at them (`status` and the panel): each job's state in words,
//! where it runs, for how long, and what it is about (the first line of its task, its folder or its
//! issue). Pure.

use std::time::{Duration, SystemTime};

use protocol::job::Job;
use queue::{OpenJob, OpenState};
use serde::Serialize;

use crate::record::unix_ms;

/// One job not done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shown {
    pub id: String,
    /// `queued`, `waiting` (to retry), `waiting-for-host` (queued, and no live worker carries the
    /// labels it needs), `running`, `lost` (its worker's lease lapsed), or `cancelling`.
    pub state: &'static str,
    pub attempt: u32,
    pub queued_at_ms: u64,
    /// The worker holding it (`host:pid`), for a running or lost job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// Seconds since it was queued.
    pub waited_secs: u64,
    /// Seconds it has been running (its current lease), for a running job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running_secs: Option<u64>,
    /// When a waiting job is tried again, or when a running job's lease lapses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
    /// The first line of its task, its repository folder, and its trigger.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    /// The forge's issue or pull (merge) request it is about: `owner/name#12`, `group/project!3`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issue: Option<String>,
    pub trigger_type: Option<String>,
    /// The labels a worker needs to take it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub needs: Vec<String>,
    /// The job it runs again, for a rerun.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<String>,
}

impl Shown {
    /// Whether it can still be cancelled.
    pub fn cancellable(&self) -> bool {
        matches!(
            self.state,
            "queued" | "waiting" | "waiting-for-host" | "running"
        )
    }
}

/// Marks the queued jobs no live worker can take as `waiting-for-host`, when some worker is live
/// (with none, every job waits for a worker alike, and the workers' list says so).
pub fn place(open: &mut [Shown], workers: &[crate::workers::WorkerShown]) {
    if !workers.iter().any(crate::workers::WorkerShown::takes_jobs) {
        return;
    }
    for job in open.iter_mut().filter(|j| j.state == "queued") {
        if !crate::workers::can_take(workers, &job.needs) {
            job.state = "waiting-for-host";
        }
    }
}

fn secs_between(from: SystemTime, to: SystemTime) -> u64 {
    to.duration_since(from).unwrap_or(Duration::ZERO).as_secs()
}

/// The first line of a task, at most 80 characters.
pub fn first_line(task: &str) -> String {
    let line = task.lines().next().unwrap_or_default().trim();
    if line.chars().count() > 80 {
        line.chars().take(79).chain(['…']).collect()
    } else {
        line.to_owned()
    }
}

/// `job` as it stands at `now`.
pub fn shown(job: &OpenJob, now: SystemTime) -> Shown {
    let queued = serde_json::from_str::<Job>(&job.payload).ok();
    let (state, worker, until) = match &job.state {
        OpenState::Queued => ("queued", None, None),
        OpenState::Waiting { until } => ("waiting", None, Some(unix_ms(*until))),
        OpenState::Leased { worker, until, .. } if *until < now => {
            ("lost", Some(worker.clone()), Some(unix_ms(*until)))
        }
        OpenState::Leased { worker, until, .. } if job.cancel_requested => {
            ("cancelling", Some(worker.clone()), Some(unix_ms(*until)))
        }
        OpenState::Leased { worker, until, .. } => {
            ("running", Some(worker.clone()), Some(unix_ms(*until)))
        }
        OpenState::Lost => ("lost", None, None),
    };
    let running_secs = match &job.state {
        OpenState::Leased { until, since, .. } if *until >= now => Some(secs_between(*since, now)),
        _ => None,
    };
    let issue = queued.as_ref().and_then(|j| j.event.as_ref()).map(|e| {
        let mark = match (e.forge, e.pull_request) {
            (protocol::forge_event::Forge::Gitlab, true) => '!',
            _ => '#',
        };
        format!("{}{mark}{}", e.repository, e.number)
    });
    Shown {
        id: job.id.clone(),
        state,
        attempt: job.attempt,
        queued_at_ms: unix_ms(job.queued_at),
        worker,
        waited_secs: secs_between(job.queued_at, now),
        running_secs,
        until_ms: until,
        task: queued
            .as_ref()
            .and_then(|j| j.task.as_deref())
            .map(first_line),
        folder: queued.as_ref().and_then(|j| j.folder.clone()),
        issue,
        needs: job.needs.clone(),
        rerun_of: queued.as_ref().and_then(|j| j.rerun_of.clone()),
        trigger_type: queued.map(|j| j.trigger_type),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(state: OpenState, payload: &str) -> OpenJob {
        OpenJob {
            id: "j1".into(),
            state,
            attempt: 1,
            queued_at: SystemTime::UNIX_EPOCH + Duration::from_secs(100),
            payload: payload.into(),
            cancel_requested: false,
            needs: vec!["gpu".into()],
            group: None,
        }
    }

    #[test]
    fn a_running_job_shows_its_worker_and_time_and_a_lapsed_lease_shows_lost() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(160);
        let mut job = Job::new("j1", "cli", "local");
        job.task = Some(format!("{}\nsecond line", "x".repeat(100)));
        let payload = serde_json::to_string(&job).unwrap();
        let leased = |until: u64| OpenState::Leased {
            worker: "h:1".into(),
            until: SystemTime::UNIX_EPOCH + Duration::from_secs(until),
            since: SystemTime::UNIX_EPOCH + Duration::from_secs(130),
        };
        let s = shown(&open(leased(200), &payload), now);
        assert_eq!(
            (s.state, s.running_secs, s.waited_secs),
            ("running", Some(30), 60)
        );
        assert_eq!(s.task.as_deref().map(|t| t.chars().count()), Some(80));
        assert!(s.cancellable());
        let s = shown(&open(leased(150), &payload), now);
        assert_eq!((s.state, s.running_secs), ("lost", None));
        assert!(!s.cancellable());
        let s = shown(&open(OpenState::Queued, "not json"), now);
        assert_eq!((s.state, s.task, s.trigger_type), ("queued", None, None));
    }

    #[test]
    fn a_queued_job_no_live_worker_can_take_waits_for_a_host() {
        use crate::workers::WorkerShown;
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(160);
        let worker = |labels: &[&str], state: &'static str| WorkerShown {
            card: queue::WorkerCard {
                id: "h:1".into(),
                host: "h".into(),
                pid: 1,
                version: "v".into(),
                labels: labels.iter().map(|l| (*l).to_owned()).collect(),
                concurrency: 1,
                running: 0,
                draining: false,
                started_ms: 0,
            },
            last_seen_ms: 0,
            seen_secs_ago: 0,
            state,
        };
        let placed = |workers: &[WorkerShown]| {
            let mut open = vec![shown(&open(OpenState::Queued, "{}"), now)];
            place(&mut open, workers);
            open[0].state
        };
        assert_eq!(placed(&[]), "queued");
        assert_eq!(placed(&[worker(&["host:h"], "live")]), "waiting-for-host");
        assert_eq!(placed(&[worker(&["host:h", "gpu"], "live")]), "queued");
        // A gone or draining worker takes nothing.
        assert_eq!(
            placed(&[worker(&["host:h"], "live"), worker(&["gpu"], "gone")]),
            "waiting-for-host"
        );
        assert_eq!(
            placed(&[worker(&["host:h"], "live"), worker(&["gpu"], "draining")]),
            "waiting-for-host"
        );
    }
}
