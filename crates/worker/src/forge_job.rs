//! What a github or gitlab job adds to a local one, after the admission: the job's token is minted,
//! its repository cloned at the event's ref (`state/jobs/<id>/workspace`, the job's user's), its
//! prompt made from the issue and the trigger's flow; after the job, a `fix` job's changes are
//! pushed to a branch of their own and proposed as a pull (merge) request, and once the record is
//! final the issue gets the job's one comment: the answer, the pull request, or the fixed sentence
//! of the rule that stopped it (`docs/forges.md`).

use std::sync::Arc;

use forge::git::{self, Author, Checkout};
use forge::{ForgeError, Forges, Secret};
use protocol::admitted::{Admitted, Flow, ForgeTarget};
use protocol::detail::Detail;
use protocol::forge_event::{Forge, ForgeEvent, Head};
use protocol::job::Job;
use protocol::reason::{Outcome, Reason, Stage};

use crate::verdict::Verdict;
use records::record::{Draft, Ending, Record};

/// The branch a job's changes are pushed to.
pub fn work_branch(job_id: &str) -> String {
    format!("pi-dispatch/{job_id}")
}

/// The author of the worker's commits.
pub fn author() -> Author {
    Author {
        name: "pi-dispatch".to_owned(),
        email: "pi-dispatch@localhost".to_owned(),
    }
}

/// A forge job, ready to run.
pub struct Prepared {
    pub token: Secret,
    pub checkout: Checkout,
    pub clone_url: String,
    /// The branch the job starts from, and a `fix` job's pull request goes into.
    pub base: String,
}

/// Mints the job's token and clones its repository into the job's own folder; the record of
/// the job when either cannot be done.
pub async fn prepare(
    forges: &Forges,
    plan: &Admitted,
    target: &ForgeTarget,
    draft: &Draft,
) -> Result<Prepared, Verdict> {
    let event = &target.event;
    let fault = |reason: Reason, e: ForgeError| fault(draft, reason, &e);
    let token = forges
        .mint(event, forge::Scope::Job)
        .await
        .map_err(|e| fault(Reason::ForgeTokenFailed, e))?;
    let head = match (&event.head, event.pull_request) {
        (Some(h), true) => Some(h.clone()),
        (None, true) => Some(
            forges
                .pull_request_head(&token, event)
                .await
                .map_err(|e| fault(Reason::ForgeCloneFailed, e))?,
        ),
        (_, false) => None,
    };
    let (source, base) = refs(event, head.as_ref());
    let clone_url = forges
        .clone_url(event)
        .map_err(|e| fault(Reason::ForgeTokenFailed, e))?;
    let authorization = Forges::git_authorization(event, &token);
    let checkout = git::clone(
        &plan.state_dir,
        &clone_url,
        &source,
        &authorization,
        &work_branch(&plan.job_id),
        (plan.workspace.uid, plan.workspace.gid),
    )
    .await
    .map_err(|e| {
        tracing::warn!(event = "forge_clone_failed", job_id = %plan.job_id, detail = %e);
        Verdict::from(draft.failed(Reason::ForgeCloneFailed, Detail::new(e.to_string())))
    })?;
    tracing::info!(event = "forge_cloned", job_id = %plan.job_id, repository = %event.repository,
        base = %base);
    Ok(Prepared {
        token,
        checkout,
        clone_url,
        base,
    })
}

/// What the job clones (a branch, or the pull request's own ref, which a fork's pull request has
/// too), and the branch a `fix` job proposes its changes to: the issue's default branch, or a pull
/// request's own branch when it is in the repository (a fork's cannot be pushed to).
pub fn refs(event: &ForgeEvent, head: Option<&Head>) -> (String, String) {
    match (event.pull_request, head) {
        (true, Some(head)) => {
            let source = match event.forge {
                Forge::Github => format!("refs/pull/{}/head", event.number),
                Forge::Gitlab => format!("refs/merge-requests/{}/head", event.number),
            };
            let base = if head.same_repository {
                head.branch.clone()
            } else {
                event.default_branch.clone()
            };
            (source, base)
        }
        _ => (event.default_branch.clone(), event.default_branch.clone()),
    }
}

/// The record of a forge request that failed: `reason` (tried again) when a later try may pass,
/// `forge-refused` (final) when the forge said no.
fn fault(draft: &Draft, reason: Reason, e: &ForgeError) -> Verdict {
    let reason = if e.may_pass() {
        reason
    } else {
        Reason::ForgeRefused
    };
    tracing::warn!(event = reason.log_event(), job_id = %draft.job_id(), detail = %e);
    draft.failed(reason, Detail::new(e.to_string())).into()
}

/// The job's prompt: the issue (or pull request) and the comment that started the job, then what
/// the flow asks. The issue's text is the forge's content, which anyone who can write there wrote.
pub fn prompt(event: &ForgeEvent, flow: Flow, base: &str) -> String {
    let item = if event.pull_request {
        event.forge.change_request()
    } else {
        "issue"
    };
    // What strangers wrote reaches the agent with nothing invisible in it.
    let shown = forge::inert::prompt_text;
    let mut text = format!(
        "You are working on {item} #{} of {}: {}\n\n{}\n",
        event.number,
        event.repository,
        shown(&event.title),
        shown(&event.body)
    );
    if let Some(c) = &event.comment {
        text.push_str(&format!(
            "\nThe comment that started this job, by {}:\n\n{}\n",
            shown(&c.author),
            shown(&c.body)
        ));
    }
    text.push('\n');
    text.push_str(&match flow {
        Flow::Fix => format!(
            "Make the change this {item} asks for, in your working folder: a clone of the repository at {base}. \
             Do not commit or push; when you finish, pi-dispatch commits what you changed and proposes it as a {}. \
             End with a short summary of what you changed and why.\n",
            event.forge.change_request()
        ),
        Flow::Answer => format!(
            "Answer this {item}. Your final message is posted on it as a comment, exactly as you write it; \
             do not post it yourself. The repository is cloned in your working folder if you need to read it.\n"
        ),
    });
    text
}

/// The most a `fix` job's tree may hold to be published: the operator's sizes, a million paths,
/// and ten minutes to read them.
pub fn publish_limits(settings: &config::settings::Settings) -> forge::tree::Limits {
    forge::tree::Limits {
        file_bytes: settings.publish_file_bytes,
        total_bytes: settings.publish_bytes,
        entries: 1_000_000,
        time: std::time::Duration::from_secs(600),
    }
}

/// What became of a completed `fix` job's changes: the pull (merge) request proposed, by its web
/// address (`None`: the job changed nothing, so nothing is proposed), or how the job ends instead.
pub type Delivered = Result<Option<String>, Ending>;

/// After a completed `fix` job: the changes pushed and proposed. A job that changed nothing
/// proposes nothing. A push or a request that fails ends the job `forge-delivery-failed` (the
/// agent's work is kept in the job's clone).
pub async fn deliver_fix(
    forges: &Forges,
    job_id: &str,
    event: &ForgeEvent,
    prepared: &Prepared,
    bounds: git::Bounds<'_>,
) -> Delivered {
    // The delivery's own token, minted now: the job's may have run out with a long job (a GitHub
    // token lives an hour), and it is revoked once the delivery is done.
    let token = match forges.mint(event, forge::Scope::Delivery).await {
        Ok(t) => t,
        Err(e) => {
            return Err(delivery_ended(
                job_id,
                Reason::ForgeDeliveryFailed,
                e.to_string(),
            ));
        }
    };
    let delivered = deliver_with(forges, job_id, event, prepared, bounds, &token).await;
    if let Err(e) = forges.revoke(event, &token).await {
        tracing::warn!(event = "forge_revoke_failed", job_id = %job_id, detail = %e);
    }
    delivered
}

/// How a completed job ends when its delivery did not happen, and why.
fn delivery_ended(job_id: &str, reason: Reason, why: String) -> Ending {
    tracing::warn!(event = reason.log_event(), job_id = %job_id, reason = %reason, detail = %why);
    Ending::failed(reason, Detail::new(why))
}

/// [`deliver_fix`] with the delivery's token.
async fn deliver_with(
    forges: &Forges,
    job_id: &str,
    event: &ForgeEvent,
    prepared: &Prepared,
    bounds: git::Bounds<'_>,
    token: &Secret,
) -> Delivered {
    let branch = work_branch(job_id);
    let authorization = Forges::git_authorization(event, token);
    let title = format!("{} (#{})", event.title, event.number);
    let failed = |why: String| delivery_ended(job_id, Reason::ForgeDeliveryFailed, why);
    let pushed = git::publish(
        &prepared.checkout,
        &prepared.clone_url,
        &authorization,
        &branch,
        &title,
        &author(),
        bounds,
    )
    .await;
    match pushed {
        Err(git::GitError::Tree(e)) => {
            let reason = match e {
                forge::tree::TreeError::TooLarge { .. } => Reason::JobOutputTooLarge,
                forge::tree::TreeError::Secret { .. } => Reason::JobOutputSecret,
                _ => Reason::JobOutputRefused,
            };
            Err(delivery_ended(job_id, reason, e.to_string()))
        }
        Err(e) => Err(failed(e.to_string())),
        Ok(None) => {
            tracing::info!(event = "forge_nothing_changed", job_id = %job_id);
            Ok(None)
        }
        Ok(Some(_)) => {
            let body = format!(
                "Proposed by pi-dispatch for #{} (job {}). Nothing here is merged by pi-dispatch.",
                event.number, job_id
            );
            match forges
                .open_change_request(token, event, &branch, &prepared.base, &title, &body)
                .await
            {
                Ok(url) => {
                    tracing::info!(event = "forge_change_proposed", job_id = %job_id, url = %url);
                    Ok(Some(url))
                }
                Err(e) => Err(failed(e.to_string())),
            }
        }
    }
}

/// The one comment of a finished job, by its record and its plan's `flow` (`None`: the job was
/// not admitted, or is not a forge job): the answer, the pull request, or which rule stopped the
/// job. Nothing for a cancelled job.
pub fn comment_for(flow: Option<Flow>, record: &Record) -> Option<String> {
    match (record.outcome, record.reason) {
        (Outcome::Completed, _) => Some(match flow {
            Some(Flow::Fix) => match &record.pull_request {
                Some(url) => format!("pi-dispatch proposed a change for this: {url}"),
                None => "pi-dispatch's agent finished without changing any file, so nothing is proposed.".to_owned(),
            },
            _ => record
                .final_message
                .clone()
                .filter(|m| !m.trim().is_empty())
                .unwrap_or_else(|| "pi-dispatch's agent finished without an answer.".to_owned()),
        }),
        (Outcome::Cancelled, _) | (_, None) => None,
        // A refusal before anything was spent says so; the same reason found in the job (the
        // job's copy of mcp.json unreadable, `mcp-config-invalid`) came after the job started,
        // and is a stop.
        (_, Some(reason)) if reason.stage() == Stage::Admission && !record.budget_reserved => {
            Some(reason.comment(record.detail.as_ref().and_then(|d| d.server.as_deref())))
        }
        (_, Some(reason)) => Some(reason.stop_comment()),
    }
}

/// How long the worker waits before each new try of a comment the forge did not take (a 5xx, a
/// 429, no connection): four tries in about 20 seconds.
pub const COMMENT_WAITS: [std::time::Duration; 3] = [
    std::time::Duration::from_secs(1),
    std::time::Duration::from_secs(4),
    std::time::Duration::from_secs(15),
];

/// Posts the job's comment on its issue (the job's event, as queued: a refused job has no plan),
/// once: a token is minted for each try and revoked after it (a refusal's job has none yet), and a
/// try the forge may take later is made again ([`COMMENT_WAITS`]). A comment that still cannot be
/// posted is logged, never retried by running the job again.
pub async fn post_comment(forges: &Arc<Forges>, job: &Job, record: &Record, flow: Option<Flow>) {
    post_comment_waiting(forges, job, record, flow, &COMMENT_WAITS).await;
}

/// [`post_comment`], with its waits between tries.
pub async fn post_comment_waiting(
    forges: &Arc<Forges>,
    job: &Job,
    record: &Record,
    flow: Option<Flow>,
    waits: &[std::time::Duration],
) {
    let Some(event) = &job.event else {
        return;
    };
    let Some(text) = comment_for(flow, record) else {
        return;
    };
    let posted = forges.post_comment(event, &job.id, &text, waits).await;
    match posted {
        Ok(p) => tracing::info!(event = "forge_comment", job_id = %job.id,
            posted = matches!(p, forge::Posted::Posted)),
        Err(e) => tracing::warn!(event = "forge_comment_failed", job_id = %job.id, detail = %e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(pull_request: bool) -> ForgeEvent {
        ForgeEvent {
            pull_request,
            head: pull_request.then(|| Head {
                branch: "feature".into(),
                sha: "abc".into(),
                same_repository: true,
            }),
            ..ForgeEvent::example(Forge::Github)
        }
    }

    #[test]
    fn an_issue_starts_from_the_default_branch_and_a_pull_request_from_its_head() {
        let e = event(false);
        assert_eq!(refs(&e, None), ("main".into(), "main".into()));
        let pr = event(true);
        assert_eq!(
            refs(&pr, pr.head.as_ref()),
            ("refs/pull/1/head".into(), "feature".into())
        );
        let mut fork = pr.clone();
        fork.head.as_mut().unwrap().same_repository = false;
        assert_eq!(refs(&fork, fork.head.as_ref()).1, "main");
        let mut gl = pr.clone();
        gl.forge = Forge::Gitlab;
        assert_eq!(refs(&gl, gl.head.as_ref()).0, "refs/merge-requests/1/head");
    }

    #[test]
    fn each_ending_has_its_comment_and_a_stop_names_no_server() {
        let job = Job::new("gh-1-t0", "label", "github");
        let answer = Some(Flow::Answer);
        let mut record = Record::ended(&job, Reason::McpUnavailable, 1, 0);
        record.detail = Some(Detail::new("docs failed").server("docs"));
        let stop = comment_for(answer, &record).unwrap();
        assert!(
            stop.contains("mcp-unavailable") && !stop.contains("docs"),
            "{stop}"
        );
        let refused = Record::ended(&job, Reason::McpServerUnknown, 1, 0)
            .with_detail(Detail::new("x").server("wiki"), "f");
        let comment = comment_for(answer, &refused).unwrap();
        assert!(comment.contains("`wiki`") && comment.contains("mcp-server-unknown"));
        // The same reason before the job and in it: a refusal, then a stop that spent.
        let before = Record::ended(&job, Reason::McpConfigInvalid, 1, 0);
        assert!(
            comment_for(answer, &before)
                .unwrap()
                .contains("Nothing was spent")
        );
        let mut within = Record::ended(&job, Reason::McpConfigInvalid, 1, 0);
        within.budget_reserved = true;
        within.exit_code = Some(2);
        let stopped = comment_for(answer, &within).unwrap();
        assert!(
            stopped.starts_with("pi-dispatch stopped this job")
                && !stopped.contains("Nothing was spent"),
            "{stopped}"
        );
        let mut done = Record::ended(&job, Reason::Cancelled, 1, 0);
        assert_eq!(comment_for(answer, &done), None);
        done.outcome = Outcome::Completed;
        done.reason = None;
        done.final_message = Some("The port is 8780.".into());
        assert_eq!(
            comment_for(answer, &done).as_deref(),
            Some("The port is 8780.")
        );
        done.pull_request = Some("http://forge/pull/3".into());
        assert!(
            comment_for(Some(Flow::Fix), &done)
                .unwrap()
                .contains("http://forge/pull/3")
        );
    }

    /// The reason table alone says whether a job is run again: a forge that may answer later (no
    /// connection, a 5xx, a 429) gives the step's own reason, which is retried; one that said no
    /// gives `forge-refused`, which is final.
    #[test]
    fn a_forge_that_said_no_is_final_and_one_that_may_answer_later_is_retried() {
        let draft = Draft::new(&Job::new("gh-1-t0", "label", "github"), 1);
        let reason_of = |e: ForgeError| match fault(&draft, Reason::ForgeTokenFailed, &e) {
            Verdict::Ended(e) => e.record.reason.unwrap(),
            Verdict::HandBack => panic!("a forge fault handed the job back"),
        };
        let status = |status| ForgeError::Status { op: "mint", status };
        for (e, reason) in [
            (status(401), Reason::ForgeRefused),
            (status(404), Reason::ForgeRefused),
            (status(503), Reason::ForgeTokenFailed),
            (status(429), Reason::ForgeTokenFailed),
            (
                ForgeError::Unreachable {
                    op: "mint",
                    why: "refused".into(),
                },
                Reason::ForgeTokenFailed,
            ),
        ] {
            let got = reason_of(e.clone());
            assert_eq!(got, reason, "{e}");
            assert_eq!(got.retried(), reason == Reason::ForgeTokenFailed, "{e}");
        }
    }

    #[test]
    fn the_prompt_holds_the_issue_the_comment_and_the_flow() {
        let mut e = event(false);
        e.title = "Wrong port".into();
        e.body = "It says 8080.".into();
        e.comment = Some(protocol::forge_event::Comment {
            id: 1,
            body: "/pi fix".into(),
            author: "maint".into(),
        });
        let p = prompt(&e, Flow::Fix, "main");
        assert!(p.contains("issue #1 of example/repository: Wrong port"));
        assert!(p.contains("It says 8080.") && p.contains("/pi fix") && p.contains("pull request"));
        assert!(prompt(&e, Flow::Answer, "main").contains("posted on it as a comment"));
    }
}
