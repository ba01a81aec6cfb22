//! A forge event as a queued job carries it: what the receiver read from one webhook delivery,
//! normalized so that a GitHub and a GitLab event of the same meaning look the same to the worker.
//! The worker clones `repository` at the event's ref, writes the event to `/job/event.json`, builds
//! the prompt from the issue (or pull request) and the comment, and answers on the same issue.

use serde::{Deserialize, Serialize};

/// The forges the receiver takes webhooks from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Forge {
    Github,
    Gitlab,
}

impl Forge {
    pub fn as_str(self) -> &'static str {
        match self {
            Forge::Github => "github",
            Forge::Gitlab => "gitlab",
        }
    }

    /// The forge of a job of `kind` (`run.kind`), when it is one the receiver serves.
    pub fn of_kind(kind: &str) -> Option<Forge> {
        match kind {
            "github" => Some(Forge::Github),
            "gitlab" => Some(Forge::Gitlab),
            _ => None,
        }
    }

    /// What this forge calls a pull request.
    pub fn change_request(self) -> &'static str {
        match self {
            Forge::Github => "pull request",
            Forge::Gitlab => "merge request",
        }
    }
}

impl std::fmt::Display for Forge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The normalized event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForgeEvent {
    pub forge: Forge,
    /// The forge's id of the delivery (`X-GitHub-Delivery`, `X-Gitlab-Event-UUID`).
    pub delivery: String,
    /// What happened, in the triggers' words: `opened`, `reopened`, `edited`, `labeled`,
    /// `synchronize`, `ready_for_review` (an issue or pull request), or `commented`.
    pub action: String,
    /// `owner/name` on GitHub, the project's full path on GitLab.
    pub repository: String,
    /// The repository's (GitHub) or project's (GitLab) numeric id.
    pub repository_id: u64,
    /// The GitHub App installation the delivery came through (GitHub only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub installation: Option<u64>,
    /// The repository's default branch.
    pub default_branch: String,
    /// The issue or pull request: its number (GitLab's `iid`), title, text and labels.
    pub number: u64,
    pub pull_request: bool,
    pub title: String,
    pub body: String,
    /// The labels after the event, and those the event added.
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default)]
    pub added_labels: Vec<String>,
    /// The comment, for a `commented` event.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub comment: Option<Comment>,
    /// A pull request's head, when the event says it (a comment on a GitHub pull request does
    /// not: the worker asks the forge).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub head: Option<Head>,
    /// Who caused the event (a login or user name).
    pub sender: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Comment {
    pub id: u64,
    pub body: String,
    pub author: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Head {
    /// The branch.
    #[serde(rename = "ref")]
    pub branch: String,
    pub sha: String,
    /// Whether the branch is in the repository itself (not in a fork).
    pub same_repository: bool,
}

impl ForgeEvent {
    /// An event of `forge` on `repository`, caused by `sender`, with nothing else said yet: the
    /// readers of each forge fill in the rest.
    pub fn new(
        forge: Forge,
        delivery: &str,
        repository: String,
        repository_id: u64,
        default_branch: String,
        sender: String,
    ) -> ForgeEvent {
        ForgeEvent {
            forge,
            delivery: delivery.to_owned(),
            action: String::new(),
            repository,
            repository_id,
            installation: None,
            default_branch,
            number: 0,
            pull_request: false,
            title: String::new(),
            body: String::new(),
            labels: Vec::new(),
            added_labels: Vec::new(),
            comment: None,
            head: None,
            sender,
        }
    }

    /// An event of `forge` that says nothing in particular, for `explain` and `doctor`, whose
    /// decisions depend on the trigger and the deployment, never on what an event says.
    pub fn example(forge: Forge) -> ForgeEvent {
        ForgeEvent {
            action: "labeled".to_owned(),
            installation: (forge == Forge::Github).then_some(1),
            number: 1,
            ..ForgeEvent::new(
                forge,
                "example",
                "example/repository".to_owned(),
                1,
                "main".to_owned(),
                "example".to_owned(),
            )
        }
    }
}

/// The mark every comment the worker posts carries, as an HTML comment the forge does not show:
/// the receiver drops comments that carry it (an answer quoting the trigger's phrase must not start
/// a job), and the worker finds by it whether it already answered a job (see [`comment_mark`]).
pub const COMMENT_MARK_PREFIX: &str = "<!-- pi-dispatch job ";

/// The mark of job `job_id`'s comment.
pub fn comment_mark(job_id: &str) -> String {
    format!("{COMMENT_MARK_PREFIX}{job_id} -->")
}

/// Whether `body` is a comment the worker posted.
pub fn is_worker_comment(body: &str) -> bool {
    body.contains(COMMENT_MARK_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_back_as_written_and_refuses_unknown_fields() {
        let event = ForgeEvent {
            forge: Forge::Github,
            delivery: "d-1".into(),
            action: "labeled".into(),
            repository: "o/r".into(),
            repository_id: 7,
            installation: Some(9),
            default_branch: "main".into(),
            number: 3,
            pull_request: false,
            title: "t".into(),
            body: "b".into(),
            labels: vec!["docs".into()],
            added_labels: vec!["docs".into()],
            comment: None,
            head: None,
            sender: "octo".into(),
        };
        let text = serde_json::to_string(&event).unwrap_or_default();
        let back: ForgeEvent = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, event);
        let mut value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        value["extra"] = serde_json::json!(1);
        assert!(serde_json::from_value::<ForgeEvent>(value).is_err());
    }

    #[test]
    fn the_mark_names_the_job_and_is_recognized() {
        let mark = comment_mark("gh-1");
        assert!(mark.contains("gh-1"));
        assert!(is_worker_comment(&format!("answer\n\n{mark}")));
        assert!(!is_worker_comment("a plain comment"));
    }
}
