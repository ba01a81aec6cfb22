//! Cron triggers: which of them are due between two instants, and the id of the job each firing
//! queues. Times are UTC. A firing's job id is the trigger's `id` and the firing's time, so every
//! worker (or host) sharing a queue queues it once: the queue keeps ids unique. Firings missed
//! while no worker ran are not made up.
//!
//! On the job's path: its start, for a cron trigger: the worker's cron thread ([`run_cron`])
//! queues each firing's job as the receiver queues a forge event's.

use chrono::{DateTime, Utc};
use config::triggers::{On, Trigger};
use croner::Cron;
use std::time::{Duration, SystemTime};

use crate::control::{Control, queue_error};

/// A cron trigger, parsed.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub trigger: Trigger,
    pub id: String,
    cron: Cron,
}

/// The cron triggers of a triggers file, each with its schedule; a pattern the cron parser
/// refuses is left out and named in the second list (by trigger index and id). The loader refuses
/// such a file already ([`config::triggers::cron_schedule`]): this is for a file read otherwise.
pub fn schedules(triggers: &[Trigger]) -> (Vec<Schedule>, Vec<(usize, String)>) {
    let mut ok = Vec::new();
    let mut refused = Vec::new();
    for t in triggers {
        if let On::Cron { id, pattern } = &t.on {
            match config::triggers::cron_schedule(pattern) {
                Ok(cron) => ok.push(Schedule {
                    trigger: t.clone(),
                    id: id.clone(),
                    cron,
                }),
                Err(_) => refused.push((t.index, id.clone())),
            }
        }
    }
    (ok, refused)
}

impl Schedule {
    /// Every firing after `from` (exclusive) up to `to` (inclusive), at most `limit`.
    pub fn firings(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut at = from;
        while out.len() < limit {
            match self.cron.find_next_occurrence(&at, false) {
                Ok(next) if next <= to => {
                    out.push(next);
                    at = next;
                }
                _ => break,
            }
        }
        out
    }
}

/// The id of the job a firing queues.
pub fn job_id(trigger_id: &str, at: DateTime<Utc>) -> String {
    format!("cron-{trigger_id}-{}", at.timestamp())
}

/// Queues the jobs of cron triggers as they come due, reading `triggers.json` each tick, until the
/// process ends. The first window starts now: firings missed while no worker ran are not made up.
pub fn run_cron(
    settings: &config::settings::Settings,
    queue: &dyn queue::Queue,
    tick: Duration,
    control: &Control,
) {
    let mut from = chrono::Utc::now();
    // What was last said about the file, so a refusal is logged once until it changes.
    let mut said: Option<String> = None;
    let mut say = |why: Option<String>| {
        if why != said {
            match &why {
                Some(why) => tracing::error!(event = "cron_triggers_refused",
                    file = %settings.triggers_file.display(), why = %why),
                None if said.is_some() => tracing::info!(event = "cron_triggers_read",
                    file = %settings.triggers_file.display()),
                None => {}
            }
            said = why;
        }
    };
    loop {
        std::thread::sleep(tick);
        if control.is_draining() {
            return;
        }
        let to = chrono::Utc::now();
        let window = (from, to);
        // The next window starts here whatever happens to this one: missed firings are not made up.
        from = to;
        let all = match config::triggers::TriggersFile::read(&settings.triggers_file) {
            Ok(all) => all.triggers,
            Err(e) => {
                say(Some(format!("{e}, so no cron trigger fires")));
                continue;
            }
        };
        say(None);
        let (schedules, refused) = crate::cron::schedules(&all.triggers);
        for (index, id) in refused {
            tracing::warn!(event = "cron_pattern_refused", trigger_index = index, id = %id);
        }
        for schedule in &schedules {
            // At most one firing per tick and trigger: a clock jump does not queue a burst.
            for at in schedule.firings(window.0, window.1, 1) {
                let id = crate::cron::job_id(&schedule.id, at);
                let mut job = schedule.trigger.job(id.clone());
                // A local job's folder is on this host: the job is this host's.
                if job.kind() == Some(protocol::job::Kind::Local) {
                    job.host = Some(settings.host_name());
                }
                let Ok(queued) = queue::NewJob::of(&job) else {
                    continue;
                };
                match queue.enqueue_job(&queued, SystemTime::now()) {
                    Ok(true) => tracing::info!(event = "cron_queued", job_id = %id,
                        trigger_index = schedule.trigger.index),
                    Ok(false) => {}
                    Err(e) => queue_error(&e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn triggers(pattern: &str) -> Vec<Trigger> {
        let text = format!(
            r#"{{"triggers": [{{"on": {{"type": "cron", "id": "nightly", "pattern": "{pattern}"}},
               "run": {{"kind": "local", "folder": "/srv/repo", "task": "Tidy up", "flow": "task"}}}}]}}"#
        );
        config::triggers::parse_triggers(text.as_bytes())
            .unwrap()
            .triggers
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn firings_between_two_instants_each_once() {
        let (s, refused) = schedules(&triggers("*/15 * * * *"));
        assert!(refused.is_empty());
        let f = s[0].firings(at("2026-11-30T10:00:00Z"), at("2026-11-30T10:45:00Z"), 10);
        assert_eq!(
            f,
            [
                at("2026-11-30T10:15:00Z"),
                at("2026-11-30T10:30:00Z"),
                at("2026-11-30T10:45:00Z")
            ]
        );
        // The next window starts where this one ended: 10:45 is not fired again.
        let next = s[0].firings(at("2026-11-30T10:45:00Z"), at("2026-11-30T10:50:00Z"), 10);
        assert!(next.is_empty());
        assert_eq!(job_id("nightly", f[0]), "cron-nightly-1796033700");
        let capped = s[0].firings(at("2026-11-30T00:00:00Z"), at("2026-11-30T23:59:00Z"), 3);
        assert_eq!(capped.len(), 3);
    }

    #[test]
    fn a_pattern_the_parser_refuses_is_named() {
        // The loader refuses such a pattern; a trigger made otherwise is still not scheduled.
        let mut t = triggers("0 3 * * *");
        if let On::Cron { pattern, .. } = &mut t[0].on {
            *pattern = "61 * * * *".to_owned();
        }
        let (s, refused) = schedules(&t);
        assert!(s.is_empty());
        assert_eq!(refused, [(0, "nightly".to_owned())]);
    }
}
