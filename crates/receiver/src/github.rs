//! GitHub's webhook events, as the triggers name them: `issues`, `pull_request` and
//! `issue_comment` (on an issue or a pull request). Everything else is ignored, and so is a comment
//! a bot wrote or the worker posted (an answer that quotes a trigger's phrase must not start a job).

use protocol::forge_event::{self, Comment, Forge, ForgeEvent, Head};

use crate::payload::{Parsed, Payload, Unreadable};

/// The header naming the event.
pub const EVENT_HEADER: &str = "x-github-event";
pub const DELIVERY_HEADER: &str = "x-github-delivery";
pub const SIGNATURE_HEADER: &str = "x-hub-signature-256";

/// Reads one delivery of event `event` (the `X-GitHub-Event` header).
pub fn parse(event: &str, delivery: &str, body: &[u8]) -> Result<Parsed, Unreadable> {
    let p = Payload::parse(body)?;
    let parsed = match event {
        "ping" => Ok(Parsed::Ping),
        "issues" => item(&p, delivery, false),
        "pull_request" => item(&p, delivery, true),
        "issue_comment" => comment(&p, delivery),
        other => Ok(Parsed::Ignored(format!(
            "GitHub's {} event is not one a trigger can name",
            shown(other)
        ))),
    };
    crate::payload::valid(parsed)
}

/// An event name as a log may show it: GitHub's are lowercase words and `_`.
fn shown(name: &str) -> &str {
    if !name.is_empty()
        && name.len() <= 40
        && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
    {
        name
    } else {
        "(unnamed)"
    }
}

fn item(p: &Payload, delivery: &str, pull_request: bool) -> Result<Parsed, Unreadable> {
    let action = p.text("/action")?;
    let known: &[&str] = if pull_request {
        &config::triggers::PULL_REQUEST_ACTIONS
    } else {
        &config::triggers::ISSUE_ACTIONS
    };
    if !known.contains(&action.as_str()) {
        return Ok(Parsed::Ignored(format!(
            "the {} action {} is not one a trigger can name",
            if pull_request {
                "pull_request"
            } else {
                "issues"
            },
            shown(&action)
        )));
    }
    let (number, title, body, labels) = if pull_request {
        (
            p.number("/pull_request/number")?,
            p.text("/pull_request/title")?,
            p.text_or_empty("/pull_request/body")?,
            p.names("/pull_request/labels", "name")?,
        )
    } else {
        (
            p.number("/issue/number")?,
            p.text("/issue/title")?,
            p.text_or_empty("/issue/body")?,
            p.names("/issue/labels", "name")?,
        )
    };
    let added_labels = if action == "labeled" {
        vec![p.text("/label/name")?]
    } else {
        Vec::new()
    };
    let head = if pull_request {
        let repository = p.text("/repository/full_name")?;
        Some(Head {
            branch: p.text("/pull_request/head/ref")?,
            sha: p.text("/pull_request/head/sha")?,
            same_repository: p.optional_text("/pull_request/head/repo/full_name")
                == Some(repository),
        })
    } else {
        None
    };
    Ok(Parsed::Event(Box::new(ForgeEvent {
        action,
        number,
        pull_request,
        title,
        body,
        labels,
        added_labels,
        comment: None,
        head,
        ..base(p, delivery)?
    })))
}

fn comment(p: &Payload, delivery: &str) -> Result<Parsed, Unreadable> {
    let action = p.text("/action")?;
    if action != "created" {
        return Ok(Parsed::Ignored(format!(
            "a comment {} is not one a trigger can name (only a new comment is)",
            shown(&action)
        )));
    }
    let body = p.text_or_empty("/comment/body")?;
    if p.optional_text("/comment/user/type").as_deref() == Some("Bot")
        || p.optional_text("/sender/type").as_deref() == Some("Bot")
    {
        return Ok(Parsed::Ignored("a comment written by a bot".to_owned()));
    }
    if forge_event::is_worker_comment(&body) {
        return Ok(Parsed::Ignored(
            "a comment pi-dispatch posted itself".to_owned(),
        ));
    }
    Ok(Parsed::Event(Box::new(ForgeEvent {
        action: "commented".to_owned(),
        number: p.number("/issue/number")?,
        pull_request: p.has("/issue/pull_request"),
        title: p.text("/issue/title")?,
        body: p.text_or_empty("/issue/body")?,
        labels: p.names("/issue/labels", "name")?,
        added_labels: Vec::new(),
        comment: Some(Comment {
            id: p.number("/comment/id")?,
            author: p.text("/comment/user/login")?,
            body,
        }),
        head: None,
        ..base(p, delivery)?
    })))
}

/// What every event has: the repository, the installation, the sender.
fn base(p: &Payload, delivery: &str) -> Result<ForgeEvent, Unreadable> {
    Ok(ForgeEvent {
        installation: p.optional_number("/installation/id"),
        ..ForgeEvent::new(
            Forge::Github,
            delivery,
            p.text("/repository/full_name")?,
            p.number("/repository/id")?,
            p.text("/repository/default_branch")?,
            p.text("/sender/login")?,
        )
    })
}
