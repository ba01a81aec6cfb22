//! The workers as people look at them (`status`, the panel and `/metrics`): what each said of
//! itself when it last announced itself, and whether it is still alive. Pure.

use std::time::{Duration, SystemTime};

use queue::{WorkerCard, WorkerSeen};
use serde::Serialize;

use crate::record::unix_ms;

/// One worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerShown {
    /// What it said of itself when it last announced itself (its jobs running then among it).
    #[serde(flatten)]
    pub card: WorkerCard,
    pub last_seen_ms: u64,
    pub seen_secs_ago: u64,
    /// `live`, `draining` (taking no new job), or `gone` (unseen for longer than the bound: killed,
    /// or its host or network is down).
    pub state: &'static str,
}

impl WorkerShown {
    /// Whether it takes new jobs.
    pub fn takes_jobs(&self) -> bool {
        self.state == "live"
    }
}

/// `seen` at `now`, a worker unseen for longer than `gone_after` shown as gone.
pub fn shown(seen: &[WorkerSeen], now: SystemTime, gone_after: Duration) -> Vec<WorkerShown> {
    seen.iter()
        .map(|w| {
            let ago = now.duration_since(w.last_seen).unwrap_or(Duration::ZERO);
            let card = &w.card;
            WorkerShown {
                card: card.clone(),
                last_seen_ms: unix_ms(w.last_seen),
                seen_secs_ago: ago.as_secs(),
                state: if ago > gone_after {
                    "gone"
                } else if card.draining {
                    "draining"
                } else {
                    "live"
                },
            }
        })
        .collect()
}

/// Whether a live worker carries every label of `needs`.
pub fn can_take(workers: &[WorkerShown], needs: &[String]) -> bool {
    workers
        .iter()
        .filter(|w| w.takes_jobs())
        .any(|w| needs.iter().all(|n| w.card.labels.contains(n)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use queue::WorkerCard;

    #[test]
    fn a_worker_unseen_past_the_bound_is_gone() {
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let seen = |draining: bool, last: u64| WorkerSeen {
            card: WorkerCard {
                id: "h:1".into(),
                host: "h".into(),
                pid: 1,
                version: "v".into(),
                labels: vec!["host:h".into()],
                concurrency: 2,
                started_ms: 0,
                running: 1,
                draining,
            },
            last_seen: at(last),
        };
        let bound = Duration::from_secs(30);
        let states = |w: &[WorkerSeen]| {
            shown(w, at(100), bound)
                .into_iter()
                .map(|w| (w.state, w.seen_secs_ago))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            states(&[
                seen(false, 70),
                seen(false, 69),
                seen(true, 90),
                seen(true, 10)
            ]),
            [("live", 30), ("gone", 31), ("draining", 10), ("gone", 90)]
        );
        let live = shown(&[seen(false, 100)], at(100), bound);
        assert!(can_take(&live, &["host:h".into()]));
        assert!(can_take(&live, &[]));
        assert!(!can_take(&live, &["gpu".into()]));
    }
}
