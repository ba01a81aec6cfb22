//! The forges' REST APIs, as the worker uses them: mint the job's token, find a pull request's
//! head, post a comment once, open a pull (merge) request. Base URLs are settings, so tests point
//! them at a fake forge on loopback. No error holds a token or a response body.

use std::sync::Arc;
use std::time::Duration;

use protocol::forge_event::{Forge, ForgeEvent, Head, comment_mark};
use serde_json::{Value, json};

use crate::token::{AppKey, Secret, basic_auth};

/// GitHub's API version the requests ask for.
const GITHUB_API_VERSION: &str = "2022-11-28";
/// How many pages of 100 comments are looked through for the worker's mark.
const MAX_COMMENT_PAGES: u32 = 10;
/// How long one API request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A GitHub App: the API, where repositories are cloned from, the App's id and key.
#[derive(Debug, Clone)]
pub struct GithubApp {
    /// `PI_GITHUB_API_URL`, `https://api.github.com` by default.
    pub api_url: String,
    /// `PI_GITHUB_URL`, `https://github.com` by default: clones are `{git_url}/{owner}/{name}.git`.
    pub git_url: String,
    pub app_id: u64,
    pub key: Arc<AppKey>,
}

/// A GitLab deployment: its URL and the token the worker acts with.
#[derive(Debug, Clone)]
pub struct GitlabDeployment {
    /// `GITLAB_URL` (without `/api/v4`): clones are `{url}/{path}.git`.
    pub url: String,
    /// `GITLAB_URL` with `/api/v4`.
    pub api_url: String,
    /// `PI_GITLAB_TOKEN`: a project, group or bot user's token with the Developer role.
    pub token: Secret,
}

/// Why a forge request failed: the step and what happened, never a token or a body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForgeError {
    #[error("{op}: the forge answered HTTP {status}")]
    Status { op: &'static str, status: u16 },
    #[error("{op}: the forge could not be reached ({why})")]
    Unreachable { op: &'static str, why: String },
    #[error("{op}: the forge's answer cannot be read (no {field})")]
    Unreadable {
        op: &'static str,
        field: &'static str,
    },
    #[error("{0}")]
    NotSetUp(String),
}

impl ForgeError {
    /// Whether trying again later may pass: the forge unreachable, a 5xx, a 429.
    pub fn may_pass(&self) -> bool {
        match self {
            ForgeError::Status { status, .. } => *status >= 500 || *status == 429,
            ForgeError::Unreachable { .. } => true,
            _ => false,
        }
    }
}

/// What a token is minted for, and so what it may do: each carries only what its holder needs
/// (GitHub narrows an installation token to the permissions asked; GitLab's is the deployment's
/// own, whatever it is minted for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The job's own token, which the job's processes hold (gh, the forge's MCP server): it
    /// reads the repository and talks on issues and pull requests, and never writes the
    /// repository (the worker pushes a fix with a delivery token, after its checks).
    Job,
    /// The worker's comment on the issue.
    Comment,
    /// The worker's delivery of a fix: its branch pushed and its pull request opened.
    Delivery,
}

impl Scope {
    /// The permissions GitHub mints the installation token with.
    pub fn github_permissions(self) -> Value {
        match self {
            Scope::Job => json!({"contents": "read", "metadata": "read",
                "issues": "write", "pull_requests": "write"}),
            Scope::Comment => json!({"metadata": "read", "issues": "write",
                "pull_requests": "write"}),
            Scope::Delivery => json!({"contents": "write", "metadata": "read",
                "pull_requests": "write"}),
        }
    }
}

/// What a comment request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posted {
    Posted,
    /// The issue holds the job's comment already (an earlier attempt posted it).
    AlreadyThere,
}

/// The forges a worker acts on.
#[derive(Debug, Clone)]
pub struct Forges {
    pub github: Option<GithubApp>,
    pub gitlab: Option<GitlabDeployment>,
    http: reqwest::Client,
}

impl Forges {
    pub fn new(github: Option<GithubApp>, gitlab: Option<GitlabDeployment>) -> Forges {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("pi-dispatch/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        Forges {
            github,
            gitlab,
            http,
        }
    }

    fn github(&self) -> Result<&GithubApp, ForgeError> {
        self.github.as_ref().ok_or_else(|| {
            ForgeError::NotSetUp(
                "no GitHub App is set up (PI_GITHUB_APP_ID, PI_GITHUB_APP_KEY_FILE)".to_owned(),
            )
        })
    }

    fn gitlab(&self) -> Result<&GitlabDeployment, ForgeError> {
        self.gitlab.as_ref().ok_or_else(|| {
            ForgeError::NotSetUp("no GitLab is set up (GITLAB_URL, PI_GITLAB_TOKEN)".to_owned())
        })
    }

    /// A token for `scope`: for GitHub an installation token of the event's installation,
    /// narrowed to the event's repository and to the scope's permissions (it lives an hour); for
    /// GitLab the deployment's token.
    pub async fn mint(&self, event: &ForgeEvent, scope: Scope) -> Result<Secret, ForgeError> {
        match event.forge {
            Forge::Gitlab => Ok(self.gitlab()?.token.clone()),
            Forge::Github => {
                let app = self.github()?;
                let installation = event.installation.ok_or_else(|| {
                    ForgeError::NotSetUp(
                        "the event came through no GitHub App installation".to_owned(),
                    )
                })?;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let jwt = app
                    .key
                    .jwt(app.app_id, now)
                    .map_err(|e| ForgeError::NotSetUp(format!("the GitHub App's key: {e}")))?;
                let op = match scope {
                    Scope::Job => "mint the job's installation token",
                    Scope::Comment => "mint the comment's installation token",
                    Scope::Delivery => "mint the delivery's installation token",
                };
                let url = format!(
                    "{}/app/installations/{installation}/access_tokens",
                    app.api_url
                );
                let answer = self
                    .send(
                        op,
                        self.github_request(reqwest::Method::POST, &url, &format!("Bearer {jwt}"))
                            .json(&json!({"repository_ids": [event.repository_id],
                                "permissions": scope.github_permissions()})),
                    )
                    .await?;
                let token = answer["token"]
                    .as_str()
                    .ok_or(ForgeError::Unreadable { op, field: "token" })?;
                Ok(Secret::new(token))
            }
        }
    }

    /// Ends a token minted for a job before its hour is out: GitHub's `DELETE
    /// /installation/token`, authorized by the token itself (one already expired or revoked is
    /// ended too). GitLab's token is the deployment's own, which stays.
    pub async fn revoke(&self, event: &ForgeEvent, token: &Secret) -> Result<(), ForgeError> {
        if event.forge == Forge::Gitlab {
            return Ok(());
        }
        let op = "revoke the job's installation token";
        let url = format!("{}/installation/token", self.github()?.api_url);
        let response = self
            .github_request(
                reqwest::Method::DELETE,
                &url,
                &format!("Bearer {}", token.expose()),
            )
            .send()
            .await
            .map_err(|e| ForgeError::Unreachable {
                op,
                why: e.without_url().to_string(),
            })?;
        match response.status().as_u16() {
            200..=299 | 401 => Ok(()),
            status => Err(ForgeError::Status { op, status }),
        }
    }

    /// Posts the job's one comment ([`Forges::comment_once`]) with a token minted for it and
    /// revoked after, trying again after each wait of `waits` while the forge's answer may pass
    /// (a 5xx, a 429, no connection). The comment's mark keeps a post that went through unseen
    /// from being posted twice.
    pub async fn post_comment(
        &self,
        event: &ForgeEvent,
        job_id: &str,
        text: &str,
        waits: &[std::time::Duration],
    ) -> Result<Posted, ForgeError> {
        let mut waits = waits.iter();
        loop {
            let tried = async {
                let token = self.mint(event, Scope::Comment).await?;
                let posted = self.comment_once(&token, event, job_id, text).await;
                if let Err(e) = self.revoke(event, &token).await {
                    tracing::warn!(event = "forge_revoke_failed", job_id, detail = %e);
                }
                posted
            }
            .await;
            match tried {
                Err(e) if e.may_pass() => match waits.next() {
                    Some(wait) => {
                        tracing::warn!(event = "forge_comment_retry", job_id, detail = %e,
                            wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
                        tokio::time::sleep(*wait).await;
                    }
                    None => return Err(e),
                },
                done => return done,
            }
        }
    }

    fn github_request(
        &self,
        method: reqwest::Method,
        url: &str,
        authorization: &str,
    ) -> reqwest::RequestBuilder {
        self.http
            .request(method, url)
            .header("Authorization", authorization)
            .header("Accept", "application/vnd.github+json")
            .header("X-GitHub-Api-Version", GITHUB_API_VERSION)
    }

    fn request(
        &self,
        event: &ForgeEvent,
        token: &Secret,
        method: reqwest::Method,
        path: &str,
    ) -> Result<reqwest::RequestBuilder, ForgeError> {
        Ok(match event.forge {
            Forge::Github => {
                let url = format!("{}{path}", self.github()?.api_url);
                self.github_request(method, &url, &format!("Bearer {}", token.expose()))
            }
            Forge::Gitlab => {
                let url = format!("{}{path}", self.gitlab()?.api_url);
                self.http
                    .request(method, url)
                    .header("PRIVATE-TOKEN", token.expose())
            }
        })
    }

    async fn send(
        &self,
        op: &'static str,
        request: reqwest::RequestBuilder,
    ) -> Result<Value, ForgeError> {
        let response = request.send().await.map_err(|e| ForgeError::Unreachable {
            op,
            why: e.without_url().to_string(),
        })?;
        let status = response.status();
        if !status.is_success() {
            return Err(ForgeError::Status {
                op,
                status: status.as_u16(),
            });
        }
        response
            .json::<Value>()
            .await
            .map_err(|_| ForgeError::Unreadable {
                op,
                field: "JSON body",
            })
    }

    /// The API path of the event's repository or project.
    fn repository_path(event: &ForgeEvent) -> String {
        match event.forge {
            Forge::Github => format!("/repos/{}", event.repository),
            Forge::Gitlab => format!("/projects/{}", event.repository_id),
        }
    }

    /// The API path of the event's issue (or pull request) comments.
    fn comments_path(event: &ForgeEvent) -> String {
        let repo = Forges::repository_path(event);
        match (event.forge, event.pull_request) {
            (Forge::Github, _) => format!("{repo}/issues/{}/comments", event.number),
            (Forge::Gitlab, false) => format!("{repo}/issues/{}/notes", event.number),
            (Forge::Gitlab, true) => format!("{repo}/merge_requests/{}/notes", event.number),
        }
    }

    /// Posts `text` on the event's issue (or pull request) as job `job_id`'s comment, unless one
    /// is there already: every comment carries the job's mark, looked for first, so that a job
    /// tried again, or a worker that died after posting, never posts twice.
    pub async fn comment_once(
        &self,
        token: &Secret,
        event: &ForgeEvent,
        job_id: &str,
        text: &str,
    ) -> Result<Posted, ForgeError> {
        let mark = comment_mark(job_id);
        let path = Forges::comments_path(event);
        for page in 1..=MAX_COMMENT_PAGES {
            let op = "read the issue's comments";
            let list = self
                .send(
                    op,
                    self.request(event, token, reqwest::Method::GET, &path)?
                        .query(&[("per_page", "100"), ("page", &page.to_string())]),
                )
                .await?;
            let items = list
                .as_array()
                .ok_or(ForgeError::Unreadable { op, field: "list" })?;
            if items
                .iter()
                .any(|c| c["body"].as_str().is_some_and(|b| b.contains(&mark)))
            {
                return Ok(Posted::AlreadyThere);
            }
            if items.len() < 100 {
                break;
            }
        }
        // What the agent wrote is posted inert (no quick action, mass mention or mark of its own).
        let body = format!("{}\n\n{mark}", crate::inert::markdown(text));
        self.send(
            "post the job's comment",
            self.request(event, token, reqwest::Method::POST, &path)?
                .json(&json!({ "body": body })),
        )
        .await?;
        Ok(Posted::Posted)
    }

    /// The head of the event's pull request, as the forge says it now (a GitHub comment's event
    /// does not carry it).
    pub async fn pull_request_head(
        &self,
        token: &Secret,
        event: &ForgeEvent,
    ) -> Result<Head, ForgeError> {
        let op = "read the pull request";
        let repo = Forges::repository_path(event);
        // Where each forge says the head's branch, its commit, and the repositories to compare.
        let (path, branch, sha, source, target) = match event.forge {
            Forge::Github => (
                format!("{repo}/pulls/{}", event.number),
                "/head/ref",
                "/head/sha",
                "/head/repo/full_name",
                None,
            ),
            Forge::Gitlab => (
                format!("{repo}/merge_requests/{}", event.number),
                "/source_branch",
                "/sha",
                "/source_project_id",
                Some("/target_project_id"),
            ),
        };
        let pr = self
            .send(op, self.request(event, token, reqwest::Method::GET, &path)?)
            .await?;
        let text = |pointer: &'static str| {
            pr.pointer(pointer)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or(ForgeError::Unreadable { op, field: pointer })
        };
        let same_repository = match target {
            // GitHub: the head's repository is the event's.
            None => pr.pointer(source).and_then(Value::as_str) == Some(event.repository.as_str()),
            Some(target) => pr.pointer(source) == pr.pointer(target),
        };
        Ok(Head {
            branch: text(branch)?,
            sha: text(sha)?,
            same_repository,
        })
    }

    /// Opens a pull (merge) request from `branch` into `base`, or finds the one already open from
    /// `branch` (an earlier attempt's); its web address. It never merges.
    pub async fn open_change_request(
        &self,
        token: &Secret,
        event: &ForgeEvent,
        branch: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<String, ForgeError> {
        let op = "open the pull request";
        let repo = Forges::repository_path(event);
        let body = crate::inert::markdown(body);
        let (list_path, query, create_path, create, url_field) = match event.forge {
            Forge::Github => {
                let owner = event.repository.split('/').next().unwrap_or_default();
                (
                    format!("{repo}/pulls"),
                    vec![
                        ("head", format!("{owner}:{branch}")),
                        ("state", "all".to_owned()),
                    ],
                    format!("{repo}/pulls"),
                    json!({"title": title, "head": branch, "base": base, "body": body,
                           "maintainer_can_modify": true}),
                    "html_url",
                )
            }
            Forge::Gitlab => (
                format!("{repo}/merge_requests"),
                vec![
                    ("source_branch", branch.to_owned()),
                    ("state", "all".to_owned()),
                ],
                format!("{repo}/merge_requests"),
                json!({"title": title, "source_branch": branch, "target_branch": base,
                       "description": body, "remove_source_branch": false}),
                "web_url",
            ),
        };
        let found = self
            .send(
                op,
                self.request(event, token, reqwest::Method::GET, &list_path)?
                    .query(&query),
            )
            .await?;
        if let Some(url) = found
            .as_array()
            .and_then(|a| a.first())
            .and_then(|pr| pr[url_field].as_str())
        {
            return Ok(url.to_owned());
        }
        let made = self
            .send(
                op,
                self.request(event, token, reqwest::Method::POST, &create_path)?
                    .json(&create),
            )
            .await?;
        made[url_field]
            .as_str()
            .map(str::to_owned)
            .ok_or(ForgeError::Unreadable {
                op,
                field: url_field,
            })
    }

    /// Where the event's repository is cloned from (no credential in it).
    pub fn clone_url(&self, event: &ForgeEvent) -> Result<String, ForgeError> {
        Ok(match event.forge {
            Forge::Github => format!("{}/{}.git", self.github()?.git_url, event.repository),
            Forge::Gitlab => format!("{}/{}.git", self.gitlab()?.url, event.repository),
        })
    }

    /// The web address of the event's issue or pull (merge) request.
    pub fn item_url(&self, event: &ForgeEvent) -> Result<String, ForgeError> {
        let (repository, n) = (&event.repository, event.number);
        Ok(match (event.forge, event.pull_request) {
            (Forge::Github, false) => {
                format!("{}/{repository}/issues/{n}", self.github()?.git_url)
            }
            (Forge::Github, true) => format!("{}/{repository}/pull/{n}", self.github()?.git_url),
            (Forge::Gitlab, false) => format!("{}/{repository}/-/issues/{n}", self.gitlab()?.url),
            (Forge::Gitlab, true) => {
                format!("{}/{repository}/-/merge_requests/{n}", self.gitlab()?.url)
            }
        })
    }

    /// The `Authorization` header git sends with the job's token.
    pub fn git_authorization(event: &ForgeEvent, token: &Secret) -> String {
        match event.forge {
            Forge::Github => basic_auth("x-access-token", token),
            Forge::Gitlab => basic_auth("oauth2", token),
        }
    }
}
