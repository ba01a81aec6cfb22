//! A fake forge on a loopback port: the parts of GitHub's and GitLab's REST APIs the worker and
//! the forges' MCP servers use, and git's smart HTTP (served by the real `git http-backend`) for
//! clones and pushes. A forge's API cannot run here, so it is faked; git, HTTP and the tokens' checks
//! are real. Every API request is kept for the test to read.
//!
//! - GitHub: the API under `/github-api` (and `/api/v3`, where a GitHub Enterprise client looks),
//!   repositories under `/git/OWNER/NAME.git`. An installation token is minted only for a JWT
//!   signed by the App's key (checked with its public half), a new one each time (the setup's
//!   token with `-N` after it), living [`FakeForge::set_token_lifetime`] (an hour by default)
//!   until `DELETE /installation/token` revokes it; every other call needs a live one, or the
//!   setup's own token (which a test may hand a server itself). A token minted with
//!   `permissions` can do only what they give, as GitHub's can: a push and a write of the
//!   contents API need `contents: write`, a pull request `pull_requests: write`, a comment
//!   `issues` or `pull_requests: write`; anything else is answered 403. One minted without them
//!   has all of the App's, as the setup's token does.
//! - GitLab: `GITLAB_URL` is `/gitlab`, the API under `/gitlab/api/v4`, repositories under
//!   `/gitlab/PATH.git`; every call needs the deployment's token.
//!
//! Nothing is ever merged: a merge request is counted ([`FakeForge::merges`]) and refused.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};

/// A fresh 2048-bit RSA key in GitHub's PEM form (PKCS#1).
pub fn app_key_pem() -> String {
    let out = std::process::Command::new("openssl")
        .args(["genrsa", "-traditional", "2048"])
        .output()
        .expect("openssl");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// One API request, as the fake saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    /// `Authorization`, or GitLab's `PRIVATE-TOKEN`, as sent.
    pub credential: Option<String>,
    pub body: Value,
}

/// An installation token the fake minted.
#[derive(Debug, Clone)]
pub struct Minted {
    pub token: String,
    pub expires: std::time::Instant,
    /// How many times `DELETE /installation/token` named it.
    pub revocations: u32,
    /// The permissions it was minted with (`None`: every permission of the App).
    pub permissions: Option<Value>,
}

impl Minted {
    fn live(&self) -> bool {
        self.revocations == 0 && std::time::Instant::now() < self.expires
    }
}

#[derive(Default)]
struct Forge {
    seen: Vec<Seen>,
    minted: Vec<Minted>,
    lifetime: Option<std::time::Duration>,
    /// Statuses the next comment posts are answered with, in order, before one is taken.
    comment_faults: std::collections::VecDeque<u16>,
    /// Comments by issue key (`github:o/r#42`, `gitlab:15#23`, `gitlab:15!4`).
    comments: HashMap<String, Vec<Value>>,
    pulls: Vec<Value>,
    merges: u32,
    issues: HashMap<String, Vec<Value>>,
    next_id: u64,
    /// Each push begun (git's receive-pack), and whether its token could write.
    pushes: Vec<bool>,
}

impl Forge {
    /// Whether `token` is a minted installation token still alive, or the setup's own token (which
    /// tests that hand a server a token themselves use, and which never ends).
    fn live_token(&self, token: &str, setup: &str) -> bool {
        token == setup || self.minted.iter().any(|m| m.token == token && m.live())
    }

    /// Whether live `token` may write with `permission` (`contents`, `issues`, ...).
    fn may_write(&self, token: &str, permission: &str) -> bool {
        match self.minted.iter().find(|m| m.token == token) {
            Some(Minted {
                permissions: Some(p),
                ..
            }) => p[permission] == "write",
            _ => true,
        }
    }
}

struct Shared {
    forge: Mutex<Forge>,
    app_id: u64,
    app_public_key: Vec<u8>,
    installation_token: String,
    gitlab_token: String,
    repos: PathBuf,
}

/// The fake forge; it stops when dropped.
pub struct FakeForge {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// Dropped, it stops the server.
    _stop: tokio::sync::oneshot::Sender<()>,
    _repos: tempfile::TempDir,
}

/// The GitHub App the fake knows, and the tokens it hands out and takes.
pub struct FakeForgeSetup {
    pub app_id: u64,
    /// The App key's public half (PKCS#1 DER): `forge::AppKey::public_der`.
    pub app_public_key: Vec<u8>,
    /// What a minted installation token is.
    pub installation_token: String,
    /// The GitLab deployment's token.
    pub gitlab_token: String,
}

impl FakeForge {
    pub fn start(setup: FakeForgeSetup) -> FakeForge {
        FakeForge::serve(std::net::TcpListener::bind("127.0.0.1:0").unwrap(), setup)
    }

    /// On port 80 of a loopback address of its own (127.X.Y.Z), as a GitHub Enterprise Server is
    /// reached: github-mcp-server 0.12 drops any other port from a `GITHUB_HOST`. Binding port 80
    /// takes root, as the tests that run jobs do.
    pub fn start_on_port_80(setup: FakeForgeSetup) -> FakeForge {
        let seed = std::process::id()
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos();
        for i in 0..200u32 {
            let n = seed.wrapping_add(i.wrapping_mul(7919));
            let addr = std::net::Ipv4Addr::new(
                127,
                1 + (n % 250) as u8,
                (n >> 8) as u8,
                1 + ((n >> 16) % 250) as u8,
            );
            if let Ok(listener) = std::net::TcpListener::bind((addr, 80)) {
                return FakeForge::serve(listener, setup);
            }
        }
        panic!("no loopback address had port 80 free (binding it takes root)");
    }

    /// On a free port of a test host, reached at its IPv4 address (where a job with egress off
    /// reaches it, and the worker too).
    pub fn start_in(host: &crate::netns::TestHost, setup: FakeForgeSetup) -> FakeForge {
        FakeForge::serve_on(host.tcp(0), host.v4.into(), setup)
    }

    /// On port 80 of a test host, as a GitHub Enterprise Server is reached: github-mcp-server 0.12
    /// drops any other port from a `GITHUB_HOST`.
    pub fn start_in_on_port_80(host: &crate::netns::TestHost, setup: FakeForgeSetup) -> FakeForge {
        FakeForge::serve_on(host.tcp(80), host.v4.into(), setup)
    }

    /// On a test host ([`crate::netns::TestHost::tcp`]'s listener), reached at the host's `address`.
    pub fn serve_on(
        listener: std::net::TcpListener,
        address: std::net::IpAddr,
        setup: FakeForgeSetup,
    ) -> FakeForge {
        let port = listener.local_addr().unwrap().port();
        let mut forge = FakeForge::serve(listener, setup);
        forge.addr = SocketAddr::new(address, port);
        forge
    }

    fn serve(listener: std::net::TcpListener, setup: FakeForgeSetup) -> FakeForge {
        let repos = tempfile::tempdir().unwrap();
        let shared = Arc::new(Shared {
            forge: Mutex::new(Forge {
                next_id: 1000,
                ..Forge::default()
            }),
            app_id: setup.app_id,
            app_public_key: setup.app_public_key,
            installation_token: setup.installation_token,
            gitlab_token: setup.gitlab_token,
            repos: repos.path().to_owned(),
        });
        // A thread and a runtime of its own, so that sync and async tests alike can use it.
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        FakeForge {
            addr,
            shared,
            _stop: stop,
            _repos: repos,
        }
    }

    /// The forge's address (without `:80` on port 80).
    pub fn url(&self) -> String {
        if self.addr.port() == 80 {
            format!("http://{}", self.addr.ip())
        } else {
            format!("http://{}", self.addr)
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `PI_GITHUB_API_URL`.
    pub fn github_api_url(&self) -> String {
        format!("{}/github-api", self.url())
    }

    /// `PI_GITHUB_API_URL` as a GitHub Enterprise Server's (`/api/v3`, its GraphQL at
    /// `/api/graphql`), which github-mcp-server reaches given the forge's [`FakeForge::url`].
    pub fn github_enterprise_api_url(&self) -> String {
        format!("{}/api/v3", self.url())
    }

    /// `PI_GITHUB_URL`.
    pub fn github_git_url(&self) -> String {
        format!("{}/git", self.url())
    }

    /// `GITLAB_URL`.
    pub fn gitlab_url(&self) -> String {
        format!("{}/gitlab", self.url())
    }

    /// Makes a repository (`OWNER/NAME` on GitHub, the project's path on GitLab) whose `main`
    /// holds `files`, one commit.
    pub fn add_repo(&self, forge: &str, path: &str, files: &[(&str, &str)]) {
        let bare = self.repo_dir(forge, path);
        let work = self
            .shared
            .repos
            .join(format!("work-{}", path.replace('/', "-")));
        std::fs::create_dir_all(&work).unwrap();
        for (name, text) in files {
            let file = work.join(name);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        }
        let git = |dir: &Path, args: &[&str]| {
            let out = std::process::Command::new("git")
                .args(args)
                .current_dir(dir)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_AUTHOR_NAME", "Maintainer")
                .env("GIT_AUTHOR_EMAIL", "maintainer@example.invalid")
                .env("GIT_COMMITTER_NAME", "Maintainer")
                .env("GIT_COMMITTER_EMAIL", "maintainer@example.invalid")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "git {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        git(&work, &["init", "-q", "-b", "main"]);
        git(&work, &["add", "-A"]);
        git(&work, &["commit", "-q", "-m", "First"]);
        std::fs::create_dir_all(bare.parent().unwrap()).unwrap();
        git(
            &self.shared.repos,
            &[
                "clone",
                "-q",
                "--bare",
                work.to_str().unwrap(),
                bare.to_str().unwrap(),
            ],
        );
        git(&bare, &["config", "http.receivepack", "true"]);
    }

    fn repo_dir(&self, forge: &str, path: &str) -> PathBuf {
        self.shared.repos.join(forge).join(format!("{path}.git"))
    }

    /// A file of branch `branch` of a repository, as pushed; `None` when there is no such file.
    pub fn file_on(&self, forge: &str, path: &str, branch: &str, file: &str) -> Option<String> {
        let out = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(self.repo_dir(forge, path))
            .args(["show", &format!("{branch}:{file}")])
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The branches of a repository.
    pub fn branches(&self, forge: &str, path: &str) -> Vec<String> {
        let out = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(self.repo_dir(forge, path))
            .args(["for-each-ref", "--format=%(refname:short)", "refs/heads"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Gives a repository (`github:o/r` or `gitlab:15`) issues to list.
    pub fn set_issues(&self, key: &str, issues: Vec<Value>) {
        self.shared
            .forge
            .lock()
            .unwrap()
            .issues
            .insert(key.to_owned(), issues);
    }

    /// Each push begun over git's smart HTTP, and whether its token could write the repository.
    pub fn pushes(&self) -> Vec<bool> {
        self.shared.forge.lock().unwrap().pushes.clone()
    }

    /// Every API request so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.shared.forge.lock().unwrap().seen.clone()
    }

    /// The comments of an issue (`github:o/r#42`, `gitlab:15#23`, `gitlab:15!4` for a merge request).
    pub fn comments(&self, key: &str) -> Vec<String> {
        self.shared
            .forge
            .lock()
            .unwrap()
            .comments
            .get(key)
            .map(|c| {
                c.iter()
                    .map(|c| c["body"].as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every installation token minted so far, oldest first.
    pub fn minted(&self) -> Vec<Minted> {
        self.shared.forge.lock().unwrap().minted.clone()
    }

    /// How long the installation tokens minted from now on live.
    pub fn set_token_lifetime(&self, lifetime: std::time::Duration) {
        self.shared.forge.lock().unwrap().lifetime = Some(lifetime);
    }

    /// Answers the next comment posts (either forge) with these statuses, one each, before a post
    /// is taken again.
    pub fn fail_comment_posts(&self, statuses: &[u16]) {
        self.shared
            .forge
            .lock()
            .unwrap()
            .comment_faults
            .extend(statuses.iter().copied());
    }

    /// The pull (merge) requests opened.
    pub fn pulls(&self) -> Vec<Value> {
        self.shared.forge.lock().unwrap().pulls.clone()
    }

    /// How many times something asked to merge.
    pub fn merges(&self) -> u32 {
        self.shared.forge.lock().unwrap().merges
    }
}

fn reply(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

trait Ok200 {
    fn ok(self) -> Response;
}

impl Ok200 for Value {
    fn ok(self) -> Response {
        reply(StatusCode::OK, self)
    }
}

fn not_found() -> Response {
    reply(StatusCode::NOT_FOUND, json!({"message": "Not Found"}))
}

/// GitHub's answer to a token without the permission a request needs.
fn forbidden() -> Response {
    reply(
        StatusCode::FORBIDDEN,
        json!({"message": "Resource not accessible by integration"}),
    )
}

/// Commits `content` as `file` on `branch` of the bare repository `bare`, as the contents API
/// does: the new commit's id.
fn commit_file(bare: &Path, branch: &str, file: &str, content: &[u8]) -> Result<String, String> {
    let git = |args: &[&str], input: Option<&[u8]>| -> Result<String, String> {
        use std::io::Write as _;
        let mut child = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(bare)
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_NAME", "api")
            .env("GIT_AUTHOR_EMAIL", "api@example.invalid")
            .env("GIT_COMMITTER_NAME", "api")
            .env("GIT_COMMITTER_EMAIL", "api@example.invalid")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        stdin
            .write_all(input.unwrap_or_default())
            .map_err(|e| e.to_string())?;
        drop(stdin);
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        match out.status.success() {
            true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
            false => Err(format!("git {args:?} failed")),
        }
    };
    let parent = git(&["rev-parse", &format!("refs/heads/{branch}")], None)?;
    let blob = git(&["hash-object", "-w", "--stdin"], Some(content))?;
    let index = bare.join("api-index");
    let with_index = |args: &[&str]| -> Result<String, String> {
        let out = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(bare)
            .args(args)
            .env("GIT_INDEX_FILE", &index)
            .output()
            .map_err(|e| e.to_string())?;
        match out.status.success() {
            true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
            false => Err(format!("git {args:?} failed")),
        }
    };
    with_index(&["read-tree", &parent])?;
    with_index(&[
        "update-index",
        "--add",
        "--cacheinfo",
        &format!("100644,{blob},{file}"),
    ])?;
    let tree = with_index(&["write-tree"])?;
    let _ = std::fs::remove_file(&index);
    let commit = git(
        &[
            "commit-tree",
            &tree,
            "-p",
            &parent,
            "-m",
            "Written through the contents API",
        ],
        None,
    )?;
    git(
        &["update-ref", &format!("refs/heads/{branch}"), &commit],
        None,
    )?;
    Ok(commit)
}

fn unauthorized() -> Response {
    reply(
        StatusCode::UNAUTHORIZED,
        json!({"message": "Bad credentials"}),
    )
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let query = uri.query().unwrap_or_default().to_owned();
    // git's smart HTTP.
    if let Some(rest) = path.strip_prefix("/git/") {
        return git_http(&shared, "github", rest, &method, &query, &headers, body).await;
    }
    if let Some(rest) = path.strip_prefix("/gitlab/")
        && !rest.starts_with("api/")
        && rest.contains(".git/")
    {
        return git_http(&shared, "gitlab", rest, &method, &query, &headers, body).await;
    }
    let credential = headers
        .get("authorization")
        .or_else(|| headers.get("private-token"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    shared.forge.lock().unwrap().seen.push(Seen {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        credential: credential.clone(),
        body: value.clone(),
    });
    let params: HashMap<String, String> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), percent_decode(v)))
        .collect();
    if let Some(rest) = path
        .strip_prefix("/github-api/")
        .or_else(|| path.strip_prefix("/api/v3/"))
    {
        return github(
            &shared,
            &method,
            rest,
            &params,
            credential.as_deref(),
            value,
        );
    }
    if path == "/api/graphql" {
        return github_graphql(&shared, credential.as_deref(), &value);
    }
    if let Some(rest) = path.strip_prefix("/gitlab/api/v4/") {
        return gitlab(
            &shared,
            &method,
            rest,
            &params,
            credential.as_deref(),
            value,
        );
    }
    not_found()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => out.push(b),
                    Err(_) => out.extend_from_slice(&bytes[i..i + 3]),
                }
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn page(items: &[Value], params: &HashMap<String, String>) -> Value {
    let per: usize = params
        .get("per_page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(30);
    let page: usize = params
        .get("page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(1)
        .max(1);
    Value::Array(
        items
            .iter()
            .skip((page - 1) * per)
            .take(per)
            .cloned()
            .collect(),
    )
}

/// The page of the list stored under `key` (none: an empty list).
fn listed(
    lists: &HashMap<String, Vec<Value>>,
    key: &str,
    params: &HashMap<String, String>,
) -> Response {
    page(
        lists.get(key).map(Vec::as_slice).unwrap_or_default(),
        params,
    )
    .ok()
}

fn github(
    shared: &Shared,
    method: &Method,
    rest: &str,
    params: &HashMap<String, String>,
    credential: Option<&str>,
    body: Value,
) -> Response {
    let parts: Vec<&str> = rest.split('/').collect();
    // The App's JWT mints the installation token.
    if let ["app", "installations", _, "access_tokens"] = parts[..] {
        let signed = credential
            .and_then(|c| c.strip_prefix("Bearer "))
            .and_then(|jwt| verify_jwt(jwt, &shared.app_public_key));
        return match signed {
            Some(claims) if claims["iss"].as_str() == Some(shared.app_id.to_string().as_str()) => {
                let mut forge = shared.forge.lock().unwrap();
                let lifetime = forge
                    .lifetime
                    .unwrap_or(std::time::Duration::from_secs(3600));
                let token = format!("{}-{}", shared.installation_token, forge.minted.len() + 1);
                forge.minted.push(Minted {
                    token: token.clone(),
                    expires: std::time::Instant::now() + lifetime,
                    revocations: 0,
                    permissions: body.get("permissions").cloned(),
                });
                reply(
                    StatusCode::CREATED,
                    json!({"token": token, "expires_at": "2099-01-01T00:00:00Z"}),
                )
            }
            _ => unauthorized(),
        };
    }
    let given = credential.and_then(|c| {
        c.strip_prefix("Bearer ")
            .or_else(|| c.strip_prefix("token "))
    });
    let mut forge = shared.forge.lock().unwrap();
    if let (&Method::DELETE, ["installation", "token"]) = (method, &parts[..]) {
        return match forge
            .minted
            .iter_mut()
            .find(|m| Some(m.token.as_str()) == given)
        {
            Some(m) => {
                let was_live = m.live();
                m.revocations += 1;
                match was_live {
                    true => StatusCode::NO_CONTENT.into_response(),
                    false => unauthorized(),
                }
            }
            None => unauthorized(),
        };
    }
    let Some(given) = given.filter(|t| forge.live_token(t, &shared.installation_token)) else {
        return unauthorized();
    };
    let may = |permission: &str| forge.may_write(given, permission);
    let needs = match (method, &parts[..]) {
        (&Method::POST, ["repos", _, _, "issues", _, "comments"]) => {
            may("issues") || may("pull_requests")
        }
        (&Method::POST, ["repos", _, _, "pulls"]) => may("pull_requests"),
        (&Method::PUT, ["repos", _, _, "contents", ..]) => may("contents"),
        _ => true,
    };
    if !needs {
        return forbidden();
    }
    match (method, &parts[..]) {
        (&Method::GET, ["repos", o, r, "issues"]) => {
            let key = format!("github:{o}/{r}");
            listed(&forge.issues, &key, params)
        }
        (&Method::GET, ["repos", o, r, "issues", n, "comments"]) => {
            let key = format!("github:{o}/{r}#{n}");
            listed(&forge.comments, &key, params)
        }
        (&Method::POST, ["repos", o, r, "issues", n, "comments"]) => {
            if let Some(code) = forge.comment_faults.pop_front() {
                return reply(
                    StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY),
                    json!({"message": "a fault the test asked for"}),
                );
            }
            forge.next_id += 1;
            let comment = json!({"id": forge.next_id, "body": body["body"],
                "user": {"login": "pi-dispatch[bot]", "type": "Bot"}});
            forge
                .comments
                .entry(format!("github:{o}/{r}#{n}"))
                .or_default()
                .push(comment.clone());
            reply(StatusCode::CREATED, comment)
        }
        (&Method::GET, ["repos", o, r, "pulls"]) => {
            let head = params.get("head").cloned().unwrap_or_default();
            let found: Vec<Value> = forge
                .pulls
                .iter()
                .filter(|p| p["repo"] == format!("github:{o}/{r}"))
                .filter(|p| {
                    head.is_empty()
                        || format!("{o}:{}", p["head"]["ref"].as_str().unwrap_or_default()) == head
                })
                .cloned()
                .collect();
            Value::Array(found).ok()
        }
        (&Method::POST, ["repos", o, r, "pulls"]) => {
            forge.next_id += 1;
            let number = forge.next_id;
            let pull = json!({"number": number, "repo": format!("github:{o}/{r}"),
                "html_url": format!("http://forge.invalid/{o}/{r}/pull/{number}"),
                "title": body["title"], "body": body["body"],
                "head": {"ref": body["head"], "sha": "0000000000000000000000000000000000000000",
                    "repo": {"full_name": format!("{o}/{r}")}},
                "base": {"ref": body["base"]}, "merged": false});
            forge.pulls.push(pull.clone());
            reply(StatusCode::CREATED, pull)
        }
        (&Method::GET, ["repos", o, r, "pulls", n]) => forge
            .pulls
            .iter()
            .find(|p| {
                p["repo"] == format!("github:{o}/{r}") && p["number"].as_u64() == n.parse().ok()
            })
            .cloned()
            .map_or_else(not_found, |p| p.ok()),
        (&Method::PUT, ["repos", o, r, "contents", file @ ..]) => {
            let bare = shared.repos.join("github").join(format!("{o}/{r}.git"));
            let branch = body["branch"].as_str().unwrap_or("main");
            let content = base64::engine::general_purpose::STANDARD
                .decode(body["content"].as_str().unwrap_or_default())
                .unwrap_or_default();
            match commit_file(&bare, branch, &file.join("/"), &content) {
                Ok(sha) => reply(StatusCode::CREATED, json!({"commit": {"sha": sha}})),
                Err(why) => reply(StatusCode::UNPROCESSABLE_ENTITY, json!({"message": why})),
            }
        }
        (&Method::PUT, ["repos", _, _, "pulls", _, "merge"]) => {
            forge.merges += 1;
            reply(
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"message": "not in this fake"}),
            )
        }
        _ => not_found(),
    }
}

/// GitHub's GraphQL API, for the one query github-mcp-server's `list_issues` makes: a
/// repository's issues, from [`FakeForge::set_issues`] (REST-shaped, turned into GraphQL nodes).
fn github_graphql(shared: &Shared, credential: Option<&str>, body: &Value) -> Response {
    let given = credential.and_then(|c| c.strip_prefix("Bearer "));
    if !given.is_some_and(|t| {
        shared
            .forge
            .lock()
            .unwrap()
            .live_token(t, &shared.installation_token)
    }) {
        return unauthorized();
    }
    let query = body["query"].as_str().unwrap_or_default();
    let vars = &body["variables"];
    if !query.contains("issues(") {
        return reply(
            StatusCode::OK,
            json!({"errors": [{"message": "not in this fake"}]}),
        );
    }
    let key = format!(
        "github:{}/{}",
        vars["owner"].as_str().unwrap_or_default(),
        vars["repo"].as_str().unwrap_or_default()
    );
    let forge = shared.forge.lock().unwrap();
    let nodes: Vec<Value> = forge
        .issues
        .get(&key)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|i| {
            json!({"number": i["number"], "title": i["title"], "body": i["body"],
                "state": i["state"].as_str().unwrap_or("open").to_uppercase(),
                "databaseId": i["id"], "author": {"login": i["user"]["login"]},
                "createdAt": "2026-11-30T10:00:00Z", "updatedAt": "2026-11-30T10:00:00Z",
                "labels": {"nodes": []}, "comments": {"totalCount": 0}})
        })
        .collect();
    let total = nodes.len();
    json!({"data": {"repository": {"issues": {"nodes": nodes,
        "pageInfo": {"hasNextPage": false, "hasPreviousPage": false, "startCursor": "", "endCursor": ""},
        "totalCount": total}}}})
    .ok()
}

fn gitlab(
    shared: &Shared,
    method: &Method,
    rest: &str,
    params: &HashMap<String, String>,
    credential: Option<&str>,
    body: Value,
) -> Response {
    let token_ok = credential.is_some_and(|c| {
        c == shared.gitlab_token || c == format!("Bearer {}", shared.gitlab_token)
    });
    if !token_ok {
        return reply(
            StatusCode::UNAUTHORIZED,
            json!({"message": "401 Unauthorized"}),
        );
    }
    let parts: Vec<&str> = rest.split('/').collect();
    let mut forge = shared.forge.lock().unwrap();
    match (method, &parts[..]) {
        (&Method::GET, ["projects", p, "issues"]) => {
            let key = format!("gitlab:{}", percent_decode(p));
            listed(&forge.issues, &key, params)
        }
        (
            &Method::GET,
            [
                "projects",
                p,
                kind @ ("issues" | "merge_requests"),
                n,
                "notes",
            ],
        ) => {
            let key = format!("gitlab:{p}{}{n}", if *kind == "issues" { "#" } else { "!" });
            listed(&forge.comments, &key, params)
        }
        (
            &Method::POST,
            [
                "projects",
                p,
                kind @ ("issues" | "merge_requests"),
                n,
                "notes",
            ],
        ) => {
            if let Some(code) = forge.comment_faults.pop_front() {
                return reply(
                    StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY),
                    json!({"message": "a fault the test asked for"}),
                );
            }
            forge.next_id += 1;
            let note = json!({"id": forge.next_id, "body": body["body"],
                "author": {"username": "pi-dispatch-bot"}, "system": false});
            let key = format!("gitlab:{p}{}{n}", if *kind == "issues" { "#" } else { "!" });
            forge.comments.entry(key).or_default().push(note.clone());
            reply(StatusCode::CREATED, note)
        }
        (&Method::GET, ["projects", p, "merge_requests"]) => {
            let source = params.get("source_branch").cloned().unwrap_or_default();
            let found: Vec<Value> = forge
                .pulls
                .iter()
                .filter(|m| m["repo"] == format!("gitlab:{p}"))
                .filter(|m| source.is_empty() || m["source_branch"] == source.as_str())
                .cloned()
                .collect();
            Value::Array(found).ok()
        }
        (&Method::POST, ["projects", p, "merge_requests"]) => {
            forge.next_id += 1;
            let iid = forge.next_id;
            let mr = json!({"iid": iid, "repo": format!("gitlab:{p}"),
                "web_url": format!("http://forge.invalid/gitlab/{p}/-/merge_requests/{iid}"),
                "title": body["title"], "description": body["description"],
                "source_branch": body["source_branch"], "target_branch": body["target_branch"],
                "source_project_id": p.parse::<u64>().unwrap_or(0),
                "target_project_id": p.parse::<u64>().unwrap_or(0), "sha": "0", "state": "opened"});
            forge.pulls.push(mr.clone());
            reply(StatusCode::CREATED, mr)
        }
        (&Method::GET, ["projects", p, "merge_requests", n]) => forge
            .pulls
            .iter()
            .find(|m| m["repo"] == format!("gitlab:{p}") && m["iid"].as_u64() == n.parse().ok())
            .cloned()
            .map_or_else(not_found, |m| m.ok()),
        (&Method::PUT, ["projects", _, "merge_requests", _, "merge"])
        | (&Method::POST, ["projects", _, "merge_requests", _, "approve"]) => {
            forge.merges += 1;
            reply(
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"message": "not in this fake"}),
            )
        }
        _ => not_found(),
    }
}

/// git's smart HTTP through `git http-backend`, for a request with the right token only.
async fn git_http(
    shared: &Shared,
    forge: &str,
    rest: &str,
    method: &Method,
    query: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok());
    let push = rest.ends_with("/git-receive-pack") || query.contains("service=git-receive-pack");
    let (allowed, may_push) = match (forge, given.as_deref().and_then(|g| g.split_once(':'))) {
        ("github", Some(("x-access-token", token))) => {
            let forge = shared.forge.lock().unwrap();
            (
                forge.live_token(token, &shared.installation_token),
                forge.may_write(token, "contents"),
            )
        }
        ("gitlab", Some(("oauth2", token))) => (token == shared.gitlab_token, true),
        _ => (false, false),
    };
    if !allowed {
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("WWW-Authenticate", "Basic realm=\"fake forge\"")
            .body(Body::empty())
            .unwrap();
    }
    if push {
        shared.forge.lock().unwrap().pushes.push(may_push);
        if !may_push {
            return Response::builder()
                .status(StatusCode::FORBIDDEN)
                .body(Body::from("Write access to repository not granted."))
                .unwrap();
        }
    }
    let root = shared.repos.join(forge);
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_PROJECT_ROOT", &root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", format!("/{rest}"))
        .env("QUERY_STRING", query)
        .env("REQUEST_METHOD", method.as_str())
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("REMOTE_USER", "job")
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let encoding = header("content-encoding");
    if !encoding.is_empty() {
        cmd.env("HTTP_CONTENT_ENCODING", encoding);
    }
    let git_protocol = header("git-protocol");
    if !git_protocol.is_empty() {
        cmd.env("GIT_PROTOCOL", git_protocol);
    }
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writing = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let _ = stdin.write_all(&body).await;
    });
    let out = child.wait_with_output().await.unwrap();
    let _ = writing.await;
    // A CGI answer: headers, a blank line, the body.
    let text = out.stdout;
    let split = text
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| (p, 4))
        .or_else(|| text.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2)));
    let Some((at, gap)) = split else {
        return reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"message": "git said nothing"}),
        );
    };
    let mut builder = Response::builder().status(StatusCode::OK);
    for line in String::from_utf8_lossy(&text[..at]).lines() {
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("status") {
                let code: u16 = value
                    .split(' ')
                    .next()
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(500);
                builder = builder.status(code);
            } else {
                builder = builder.header(name.trim(), value);
            }
        }
    }
    builder.body(Body::from(text[at + gap..].to_vec())).unwrap()
}

/// Whether `jwt` is signed RS256 (as GitHub checks an App's JWT) by the key whose public half is `public_der`, and its claims.
fn verify_jwt(jwt: &str, public_der: &[u8]) -> Option<serde_json::Value> {
    let (signing_input, signature) = jwt.rsplit_once('.')?;
    let (header, claims) = signing_input.split_once('.')?;
    let header: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(header)
            .ok()?,
    )
    .ok()?;
    if header["alg"] != "RS256" {
        return None;
    }
    let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(signature)
        .ok()?;
    ring::signature::UnparsedPublicKey::new(
        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
        public_der,
    )
    .verify(signing_input.as_bytes(), &signature)
    .ok()?;
    serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(claims)
            .ok()?,
    )
    .ok()
}
