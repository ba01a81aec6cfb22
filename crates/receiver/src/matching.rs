//! Which triggers an event starts, and the jobs it queues: pure functions of `triggers.json` (as
//! the loader read it) and the event.
//!
//! - `label`: a label was added, and the item's labels now hold one of `any` (when given), all of
//!   `all` and none of `none`, and the label added is one of `any` or `all` (adding an unrelated
//!   label to an issue that already matches starts nothing). Labels are compared exactly.
//! - `comment`: a new comment whose text holds `phrase` (exactly as written, anywhere in it).
//! - `issue`: an issue (not a pull request) with that action.
//! - `pull_request`: a pull (merge) request with that action.
//!
//! A trigger answers only its own forge (`run.kind` `github` or `gitlab`); a cron trigger never
//! matches an event.

use config::triggers::{On, Trigger, Triggers};
use protocol::forge_event::ForgeEvent;
use protocol::job::Job;

/// Whether `trigger` starts on `event`.
pub fn matches(trigger: &Trigger, event: &ForgeEvent) -> bool {
    if trigger.run.kind.as_str() != event.forge.as_str() {
        return false;
    }
    match &trigger.on {
        On::Cron { .. } => false,
        On::Label { any, all, none } => {
            if event.added_labels.is_empty() {
                return false;
            }
            let has = |l: &String| event.labels.contains(l) || event.added_labels.contains(l);
            (any.is_empty() || any.iter().any(has))
                && all.iter().all(has)
                && !none.iter().any(has)
                && event
                    .added_labels
                    .iter()
                    .any(|l| any.contains(l) || all.contains(l))
        }
        On::Comment { phrase } => {
            event.action == "commented"
                && event
                    .comment
                    .as_ref()
                    .is_some_and(|c| c.body.contains(phrase.as_str()))
        }
        On::Issue { action } => !event.pull_request && event.action == *action,
        On::PullRequest { action } => event.pull_request && event.action == *action,
    }
}

/// The id of the job trigger `index` queues for `event`: the forge, the delivery and the trigger,
/// so that one delivery never queues one trigger's job twice.
pub fn job_id(event: &ForgeEvent, index: usize) -> String {
    let forge = match event.forge {
        protocol::forge_event::Forge::Github => "gh",
        protocol::forge_event::Forge::Gitlab => "gl",
    };
    format!("{forge}-{}-t{index}", event.delivery)
}

/// The jobs `event` queues, one per matching trigger, in the file's order. Each carries its
/// trigger's run fields as the loader normalized them, and the event.
pub fn jobs_for(triggers: &Triggers, event: &ForgeEvent) -> Vec<Job> {
    triggers
        .triggers
        .iter()
        .filter(|t| matches(t, event))
        .map(|t| Job {
            event: Some(event.clone()),
            ..t.job(job_id(event, t.index))
        })
        .collect()
}

/// The jobs `event` queues, as the queue takes them: each needs its trigger's labels, and all are
/// in the group of the event's issue, so that they run one at a time. When a matching trigger says
/// `"sameIssue": "cancel-older"`, the delivery's first job supersedes the issue's jobs queued by
/// earlier deliveries (never its own siblings, which follow it).
pub fn queued(
    triggers: &Triggers,
    event: &ForgeEvent,
) -> Result<Vec<queue::NewJob>, serde_json::Error> {
    let jobs = jobs_for(triggers, event);
    let supersede = triggers
        .triggers
        .iter()
        .filter(|t| jobs.iter().any(|j| j.trigger_index == Some(t.index)))
        .any(|t| t.run.same_issue == config::triggers::SameIssue::CancelOlder);
    let mut rows = jobs
        .iter()
        .map(queue::NewJob::of)
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(first) = rows.first_mut() {
        first.placement.supersede = supersede;
    }
    Ok(rows)
}
