//! GitLab's webhook events, as the triggers name them: `Issue Hook`, `Merge Request Hook` and
//! `Note Hook` (a comment on an issue or a merge request). GitLab's actions are put in the triggers'
//! words (`open` is `opened`, an update that added labels is `labeled`, one with new commits is
//! `synchronize`, a draft marked ready is `ready_for_review`, any other update is `edited`).
//! Confidential issues and notes, system notes and notes the worker posted are ignored.

use protocol::forge_event::{self, Comment, Forge, ForgeEvent, Head};

use crate::payload::{Parsed, Payload, Unreadable};

pub const EVENT_HEADER: &str = "x-gitlab-event";
/// The delivery's id: `Idempotency-Key` (the same on every retry of one delivery), else the
/// event's UUID.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";
pub const DELIVERY_HEADER: &str = "x-gitlab-event-uuid";
pub const TOKEN_HEADER: &str = "x-gitlab-token";

/// Reads one delivery of event `event` (the `X-Gitlab-Event` header).
pub fn parse(event: &str, delivery: &str, body: &[u8]) -> Result<Parsed, Unreadable> {
    let p = Payload::parse(body)?;
    let parsed = match event {
        "Issue Hook" => issue(&p, delivery),
        "Merge Request Hook" => merge_request(&p, delivery),
        "Note Hook" => note(&p, delivery),
        "Confidential Issue Hook" | "Confidential Note Hook" => Ok(Parsed::Ignored(
            "confidential issues and their notes start no job".to_owned(),
        )),
        _ => Ok(Parsed::Ignored(
            "this GitLab event is not one a trigger can name".to_owned(),
        )),
    };
    crate::payload::valid(parsed)
}

/// The labels the update added (`changes.labels`), by title.
fn added_labels(p: &Payload) -> Result<Vec<String>, Unreadable> {
    let before = p.names("/changes/labels/previous", "title")?;
    let after = p.names("/changes/labels/current", "title")?;
    Ok(after.into_iter().filter(|l| !before.contains(l)).collect())
}

/// GitLab's `open`, `reopen` and `update` in the triggers' words; `None` for the others.
fn action(
    p: &Payload,
    merge_request: bool,
    added: &[String],
) -> Result<Option<&'static str>, Unreadable> {
    Ok(match p.text("/object_attributes/action")?.as_str() {
        "open" => Some("opened"),
        "reopen" => Some("reopened"),
        "update" if !added.is_empty() => Some("labeled"),
        "update" if merge_request && p.has("/object_attributes/oldrev") => Some("synchronize"),
        "update"
            if merge_request
                && p.flag("/changes/draft/previous")
                && p.has("/changes/draft/current")
                && !p.flag("/changes/draft/current") =>
        {
            Some("ready_for_review")
        }
        "update" => Some("edited"),
        _ => None,
    })
}

fn ignored_action(kind: &str) -> Parsed {
    Parsed::Ignored(format!("this {kind} action is not one a trigger can name"))
}

fn issue(p: &Payload, delivery: &str) -> Result<Parsed, Unreadable> {
    let added = added_labels(p)?;
    let Some(action) = action(p, false, &added)? else {
        return Ok(ignored_action("issue"));
    };
    if p.flag("/object_attributes/confidential") {
        return Ok(Parsed::Ignored(
            "confidential issues start no job".to_owned(),
        ));
    }
    Ok(Parsed::Event(Box::new(ForgeEvent {
        action: action.to_owned(),
        number: p.number("/object_attributes/iid")?,
        pull_request: false,
        title: p.text("/object_attributes/title")?,
        body: p.text_or_empty("/object_attributes/description")?,
        labels: p.names("/labels", "title")?,
        added_labels: added,
        ..base(p, delivery)?
    })))
}

fn merge_request(p: &Payload, delivery: &str) -> Result<Parsed, Unreadable> {
    let added = added_labels(p)?;
    let Some(action) = action(p, true, &added)? else {
        return Ok(ignored_action("merge request"));
    };
    Ok(Parsed::Event(Box::new(ForgeEvent {
        action: action.to_owned(),
        number: p.number("/object_attributes/iid")?,
        pull_request: true,
        title: p.text("/object_attributes/title")?,
        body: p.text_or_empty("/object_attributes/description")?,
        labels: p.names("/labels", "title")?,
        added_labels: added,
        head: Some(Head {
            branch: p.text("/object_attributes/source_branch")?,
            sha: p.text("/object_attributes/last_commit/id")?,
            same_repository: p.optional_number("/object_attributes/source_project_id")
                == p.optional_number("/object_attributes/target_project_id"),
        }),
        ..base(p, delivery)?
    })))
}

fn note(p: &Payload, delivery: &str) -> Result<Parsed, Unreadable> {
    let body = p.text_or_empty("/object_attributes/note")?;
    if p.flag("/object_attributes/system") {
        return Ok(Parsed::Ignored("a note GitLab wrote itself".to_owned()));
    }
    if forge_event::is_worker_comment(&body) {
        return Ok(Parsed::Ignored(
            "a comment pi-dispatch posted itself".to_owned(),
        ));
    }
    let on = p.text("/object_attributes/noteable_type")?;
    let (item, pull_request) = match on.as_str() {
        "Issue" => ("/issue", false),
        "MergeRequest" => ("/merge_request", true),
        _ => {
            return Ok(Parsed::Ignored(
                "a note on a commit or a snippet starts no job".to_owned(),
            ));
        }
    };
    if !pull_request && p.flag("/issue/confidential") {
        return Ok(Parsed::Ignored(
            "confidential issues start no job".to_owned(),
        ));
    }
    let field = |name: &str| format!("{item}/{name}");
    let missing = |name: &'static str| Unreadable::Missing(name);
    let number = p.optional_number(&field("iid")).ok_or_else(|| {
        missing(if pull_request {
            "/merge_request/iid"
        } else {
            "/issue/iid"
        })
    })?;
    let title = p.optional_text(&field("title")).ok_or_else(|| {
        missing(if pull_request {
            "/merge_request/title"
        } else {
            "/issue/title"
        })
    })?;
    let head = if pull_request {
        Some(Head {
            branch: p.text("/merge_request/source_branch")?,
            sha: p.text("/merge_request/last_commit/id")?,
            same_repository: p.optional_number("/merge_request/source_project_id")
                == p.optional_number("/merge_request/target_project_id"),
        })
    } else {
        None
    };
    let labels = if pull_request {
        p.names("/merge_request/labels", "title")?
    } else {
        p.names("/issue/labels", "title")?
    };
    Ok(Parsed::Event(Box::new(ForgeEvent {
        action: "commented".to_owned(),
        number,
        pull_request,
        title,
        body: p.optional_text(&field("description")).unwrap_or_default(),
        labels,
        added_labels: Vec::new(),
        comment: Some(Comment {
            id: p.number("/object_attributes/id")?,
            author: p.text("/user/username")?,
            body,
        }),
        head,
        ..base(p, delivery)?
    })))
}

/// What every event has: the project and the user.
fn base(p: &Payload, delivery: &str) -> Result<ForgeEvent, Unreadable> {
    Ok(ForgeEvent::new(
        Forge::Gitlab,
        delivery,
        p.text("/project/path_with_namespace")?,
        p.number("/project/id")?,
        p.text("/project/default_branch")?,
        p.text("/user/username")?,
    ))
}
