//! Forge jobs end to end on loopback: a signed webhook reaches a real `pi-dispatch receiver`, which
//! queues the trigger's job; `pi-dispatch worker` mints the job's token from the fake forge (the App's
//! JWT for GitHub, the deployment's token for GitLab), clones the repository over git's smart HTTP,
//! runs real pi in its sandbox against the scripted model, and answers on the issue: the agent's
//! answer, a pull (merge) request for a fix, or the refusal's fixed sentence. Only the forge's API
//! and the model are fakes, each a real HTTP server on loopback.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use testkit::fake_forge::{FakeForge, FakeForgeSetup, app_key_pem};
use testkit::fake_model::Step;
use testkit::netns::TestHost;

use crate::common::{Listening, Run};
use crate::worker::{Service, stdio};

const APP_ID: u64 = 4242;
pub(crate) const INSTALLATION_TOKEN: &str = "ghs_CNRY-installation-token-51d0";
pub(crate) const GITLAB_TOKEN: &str = "glpat-CNRY-deployment-token-8e2b";
const WEBHOOK_SECRET: &str = "CNRY-webhook-secret-0c4e";
const GITLAB_HOOK_TOKEN: &str = "CNRY-gitlab-hook-token-3a9d";
const README: &str = "The service listens on port 8080.\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Github,
    Gitlab,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Github => "github",
            Kind::Gitlab => "gitlab",
        }
    }

    /// The repository's path on the fake forge.
    pub(crate) fn repository(self) -> &'static str {
        match self {
            Kind::Github => "octo-org/hello",
            Kind::Gitlab => "group/sub/hello",
        }
    }

    /// The fake forge's key of issue `number`'s comments.
    pub(crate) fn issue_key(self, number: u64) -> String {
        match self {
            Kind::Github => format!("github:octo-org/hello#{number}"),
            Kind::Gitlab => format!("gitlab:15#{number}"),
        }
    }

    fn job_prefix(self) -> &'static str {
        match self {
            Kind::Github => "gh",
            Kind::Gitlab => "gl",
        }
    }
}

/// A line from the middle of the App key's PEM: none of it may leave the key file.
pub(crate) fn key_canary(pem: &str) -> String {
    pem.lines().nth(3).unwrap().to_owned()
}

/// A deployment with a fake forge, a running receiver and the triggers of `triggers`.
pub(crate) struct Site {
    pub(crate) s: Service,
    pub(crate) fake: FakeForge,
    pub(crate) key_pem: String,
    receiver: Listening,
    client: reqwest::blocking::Client,
}

impl Site {
    /// A deployment whose fake forge `start_fake` starts for the App's key (its public half) and
    /// the forge's tokens; `image` is `image install`'s extra arguments.
    pub(crate) fn start(
        start_fake: impl FnOnce(&TestHost, FakeForgeSetup) -> FakeForge,
        script: Vec<Step>,
        triggers: Value,
        image: &[&str],
    ) -> Site {
        Site::start_on(TestHost::new(), start_fake, script, triggers, image)
    }

    /// [`Site::start`] with the service's peers on `host` (the forge's among them: where jobs with
    /// egress off reach it).
    pub(crate) fn start_on(
        host: TestHost,
        start_fake: impl FnOnce(&TestHost, FakeForgeSetup) -> FakeForge,
        script: Vec<Step>,
        triggers: Value,
        image: &[&str],
    ) -> Site {
        let key_pem = app_key_pem();
        let public = forge::AppKey::from_pem(&key_pem).unwrap().public_der();
        let fake = start_fake(
            &host,
            FakeForgeSetup {
                app_id: APP_ID,
                app_public_key: public,
                installation_token: INSTALLATION_TOKEN.into(),
                gitlab_token: GITLAB_TOKEN.into(),
            },
        );
        fake.add_repo(
            "github",
            Kind::Github.repository(),
            &[("README.md", README)],
        );
        fake.add_repo(
            "gitlab",
            Kind::Gitlab.repository(),
            &[("README.md", README)],
        );
        let env = format!(
            "PI_GITHUB_API_URL={}\nPI_GITHUB_URL={}\nPI_GITHUB_APP_ID={APP_ID}\n\
             PI_GITHUB_APP_KEY_FILE=app-key.pem\nPI_GITHUB_WEBHOOK_SECRET={WEBHOOK_SECRET}\n\
             GITLAB_URL={}\nPI_GITLAB_TOKEN={GITLAB_TOKEN}\nPI_GITLAB_WEBHOOK_TOKEN={GITLAB_HOOK_TOKEN}\n",
            fake.github_enterprise_api_url(),
            fake.github_git_url(),
            fake.gitlab_url(),
        );
        let servers = |_: &str| {
            json!({"everything": stdio(None),
                "broken": {"command": "false", "description": "A server that exits at once"}})
        };
        let s = Service::on_host(host, script, servers, &env, image);
        let key = s.d.write("app-key.pem", &key_pem);
        crate::worker::chmod(&key, 0o600);
        s.d.write("triggers.json", &triggers.to_string());

        let receiver = Listening::start(
            s.d.command(&[
                "receiver",
                "--listen",
                "127.0.0.1:0",
                "--log-format",
                "json",
            ]),
            "receiver_listening",
        );
        Site {
            s,
            fake,
            key_pem,
            receiver,
            client: reqwest::blocking::Client::new(),
        }
    }

    /// Sends the forge's "issue labeled" webhook for issue `number` of `kind`'s repository, now
    /// labeled `label`, as delivery `delivery`; the receiver's answer.
    pub(crate) fn label(&self, kind: Kind, number: u64, label: &str, delivery: &str) -> Value {
        self.deliver(label_delivery(kind, number, label, delivery))
    }

    /// Sends a signed delivery (`label_delivery`'s shape) to the receiver; its answer.
    pub(crate) fn deliver(
        &self,
        (path, body, headers): (&'static str, String, Vec<(&'static str, String)>),
    ) -> Value {
        let mut request = self
            .client
            .post(format!("{}/{path}", self.receiver.url))
            .header("Content-Type", "application/json")
            .body(body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let response = request.send().unwrap();
        let status = response.status().as_u16();
        let answer: Value = response.json().unwrap();
        json!({"status": status, "answer": answer})
    }

    /// Runs the worker until the queue is empty while a watcher reads every process's command
    /// line for the forge's secrets.
    pub(crate) fn work(&self) -> Run {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (seen, stop) = (seen.clone(), stop.clone());
            let secrets = self.secrets();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for (pid, line) in command_lines() {
                        if secrets.iter().any(|s| line.contains(s.as_str())) {
                            seen.lock().unwrap().push(format!("{pid}: {line}"));
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            })
        };
        let run = self.s.work();
        stop.store(true, Ordering::Relaxed);
        watcher.join().unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            Vec::<String>::new(),
            "a process argument held a forge secret"
        );
        run
    }

    /// Every value the forge gives the worker or the receiver, none of which may leave where the
    /// operator put it (`.env`, the key file) but to the forge and into the job's environment.
    pub(crate) fn secrets(&self) -> Vec<String> {
        vec![
            INSTALLATION_TOKEN.to_owned(),
            GITLAB_TOKEN.to_owned(),
            WEBHOOK_SECRET.to_owned(),
            GITLAB_HOOK_TOKEN.to_owned(),
            key_canary(&self.key_pem),
        ]
    }

    pub(crate) fn receiver_log(&self) -> String {
        self.receiver.log()
    }

    /// No secret in any file of the deployment but `.env` and the key file (records, transcripts,
    /// the queue, both clones and their git configuration), in a comment, or in a log.
    pub(crate) fn assert_no_secret_leaked(&self, logs: &[&str]) {
        let secrets = self.secrets();
        let d = self.s.d.path();
        for (path, bytes) in crate::common::files_under(d) {
            if path == d.join(".env")
                || path == d.join("app-key.pem")
                || path.starts_with(d.join("images"))
            {
                continue;
            }
            let text = String::from_utf8_lossy(&bytes);
            for secret in &secrets {
                assert!(
                    !text.contains(secret.as_str()),
                    "{} holds a forge secret",
                    path.display()
                );
            }
        }
        for kind in [Kind::Github, Kind::Gitlab] {
            for number in 1..=20 {
                for comment in self.fake.comments(&kind.issue_key(number)) {
                    for secret in &secrets {
                        assert!(!comment.contains(secret.as_str()), "{comment}");
                    }
                }
            }
        }
        let receiver_log = self.receiver_log();
        for log in logs.iter().copied().chain([receiver_log.as_str()]) {
            for secret in &secrets {
                assert!(!log.contains(secret.as_str()), "a log holds a forge secret");
            }
        }
    }
}

/// The forge's "issue labeled" webhook for issue `number` of `kind`'s repository, now labeled
/// `label`, as delivery `delivery`: the receiver's path, the body and the headers.
pub(crate) fn label_delivery(
    kind: Kind,
    number: u64,
    label: &str,
    delivery: &str,
) -> (&'static str, String, Vec<(&'static str, String)>) {
    label_delivery_of(
        kind,
        number,
        label,
        delivery,
        "The README says 8080; the service listens on 8780.",
    )
}

/// [`label_delivery`] of an issue whose text is `text` (GitHub's; GitLab's has the usual text).
pub(crate) fn label_delivery_of(
    kind: Kind,
    number: u64,
    label: &str,
    delivery: &str,
    text: &str,
) -> (&'static str, String, Vec<(&'static str, String)>) {
    match kind {
        Kind::Github => {
            let body = json!({
                    "action": "labeled",
                    "issue": {"number": number, "title": "The docs say the wrong port",
                        "body": text,
                        "user": {"login": "reporter", "type": "User"},
                        "labels": [{"name": "bug"}, {"name": label}], "state": "open"},
                    "label": {"name": label},
                    "repository": {"id": 1296269, "name": "hello", "full_name": Kind::Github.repository(),
                        "private": false, "owner": {"login": "octo-org"}, "default_branch": "main"},
                    "sender": {"login": "maintainer", "type": "User"},
                    "installation": {"id": 987654}
                })
                .to_string();
            let signature =
                receiver::signature::github_signature(WEBHOOK_SECRET.as_bytes(), body.as_bytes());
            (
                "github",
                body,
                vec![
                    ("X-GitHub-Event", "issues".to_owned()),
                    ("X-GitHub-Delivery", delivery.to_owned()),
                    ("X-Hub-Signature-256", signature),
                ],
            )
        }
        Kind::Gitlab => {
            let body = json!({
                    "object_kind": "issue", "event_type": "issue",
                    "user": {"id": 1, "name": "Maintainer", "username": "maintainer"},
                    "project": {"id": 15, "name": "hello", "path_with_namespace": Kind::Gitlab.repository(),
                        "default_branch": "main", "web_url": "http://gitlab.example/group/sub/hello"},
                    "object_attributes": {"id": 300 + number, "iid": number,
                        "title": "The docs say the wrong port",
                        "description": "The README says 8080; the service listens on 8780.",
                        "state": "opened", "action": "update", "confidential": false},
                    "labels": [{"id": 207, "title": "bug"}, {"id": 208, "title": label}],
                    "changes": {"labels": {"previous": [{"id": 207, "title": "bug"}],
                        "current": [{"id": 207, "title": "bug"}, {"id": 208, "title": label}]}}
                })
                .to_string();
            (
                "gitlab",
                body,
                vec![
                    ("X-Gitlab-Event", "Issue Hook".to_owned()),
                    ("X-Gitlab-Event-UUID", delivery.to_owned()),
                    ("X-Gitlab-Token", GITLAB_HOOK_TOKEN.to_owned()),
                ],
            )
        }
    }
}

/// Every process's command line (arguments joined by spaces).
fn command_lines() -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let line = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&line).replace('\0', " ")))
        })
        .collect()
}

/// The triggers of these tests, for both forges: `wiki` names a server the overlay does not offer;
/// `pi-answer` and `pi-fix` follow their flows with no server; `broken` names a server that exits
/// as it starts.
pub(crate) fn triggers() -> Value {
    let mut all = Vec::new();
    for kind in ["github", "gitlab"] {
        all.push(json!({"on": {"type": "label", "any": ["wiki"]},
            "run": {"kind": kind, "flow": "answer", "mcp": ["wiki"]}}));
        all.push(json!({"on": {"type": "label", "any": ["pi-answer"]},
            "run": {"kind": kind, "flow": "answer"}}));
        all.push(json!({"on": {"type": "label", "any": ["pi-fix"]},
            "run": {"kind": kind, "flow": "fix"}}));
        all.push(json!({"on": {"type": "label", "any": ["broken"]},
            "run": {"kind": kind, "flow": "answer", "mcp": ["broken"]}}));
    }
    json!({ "triggers": all })
}

const ANSWER: &str = "The service listens on 8780; the README is wrong.";

/// A signed "issue labeled" webhook through the receiver and the worker, three ways, on `kind`:
/// a job naming a server nobody offers is refused and its one comment says so; a job that answers
/// reads the clone and its answer is posted; a job that fixes pushes a branch and opens a pull
/// (merge) request, which nothing merges. No secret leaves where it belongs.
fn forge_jobs_run_from_a_webhook_to_their_comment(kind: Kind) {
    let script = vec![
        // The answer job reads the clone and prints the forge's token (its transcript must not
        // keep it), then answers.
        Step::call(
            "bash",
            json!({"command": "cat README.md; echo \"token: ${GH_TOKEN:-}${GITLAB_TOKEN:-}\""}),
        ),
        Step::text(ANSWER),
        // The fix job changes the file, then says what it did.
        Step::call(
            "bash",
            json!({"command": "sed -i 's/8080/8780/' README.md && cat README.md"}),
        ),
        Step::text("Corrected the port in the README."),
    ];
    let site = Site::start(FakeForge::start_in, script, triggers(), &[]);
    let prefix = kind.job_prefix();

    // 1. Refused at pickup: one comment naming the server and the rule, and nothing else.
    let a = site.label(kind, 1, "wiki", "d-wiki-1");
    assert_eq!(a["status"], 202, "{a}");
    let refused_id = a["answer"]["jobs"][0].as_str().unwrap().to_owned();
    assert!(refused_id.starts_with(prefix), "{refused_id}");
    let first = site.work();
    let record = site.s.record(&refused_id);
    assert_eq!(record["outcome"], "policy", "{record:#}");
    assert_eq!(record["reason"], "mcp-server-unknown");
    assert_eq!(record["budgetReserved"], false);
    let comments = site.fake.comments(&kind.issue_key(1));
    assert_eq!(comments.len(), 1, "{comments:#?}");
    let comment = &comments[0];
    assert!(
        comment.contains("`wiki`") && comment.contains("mcp-server-unknown"),
        "{comment}"
    );
    for word in [
        "127.0.0.1",
        "localhost",
        "http",
        "GITLAB",
        "PI_",
        "TOKEN",
        "$",
    ] {
        assert!(
            !comment.contains(word),
            "the comment names {word}: {comment}"
        );
    }
    // The same delivery again queues nothing, and a second worker posts nothing more.
    let again = site.label(kind, 1, "wiki", "d-wiki-1");
    assert_eq!(again["answer"]["outcome"], "duplicate", "{again}");
    let second = site.work();
    assert_eq!(site.fake.comments(&kind.issue_key(1)).len(), 1);
    // No model call was made for it.
    assert!(site.s.model.requests().is_empty());

    // 2. The answer flow: the clone is the repository's, and the agent's answer is the comment.
    let a = site.label(kind, 2, "pi-answer", "d-answer-2");
    assert_eq!(a["status"], 202, "{a}");
    let answer_id = a["answer"]["jobs"][0].as_str().unwrap().to_owned();
    let third = site.work();
    let record = site.s.record(&answer_id);
    assert_eq!(
        record["outcome"], "completed",
        "{record:#}\n{}",
        third.stderr
    );
    let results = site.s.results();
    assert!(results[1].contains("port 8080"), "{results:#?}");
    // The job held its token (the agent printed it), and its transcript was kept without it.
    let token = match kind {
        Kind::Github => INSTALLATION_TOKEN,
        Kind::Gitlab => GITLAB_TOKEN,
    };
    assert!(results[1].contains(token), "{results:#?}");
    let transcript = site
        .s
        .d
        .path()
        .join(format!("state/jobs/{answer_id}/transcript.jsonl"));
    let transcript = std::fs::read_to_string(&transcript).unwrap();
    assert!(transcript.contains("port 8080"), "{transcript}");
    assert_eq!(site.fake.comments(&kind.issue_key(2)).len(), 1);
    let posted = &site.fake.comments(&kind.issue_key(2))[0];
    assert!(posted.starts_with(ANSWER), "{posted}");
    // The prompt held the issue.
    let prompt = site.s.model.requests()[0].body.to_string();
    assert!(prompt.contains("The docs say the wrong port"), "{prompt}");
    // The record says what the job was for: the issue, its address, its title.
    let item = format!("{}#2", kind.repository());
    assert_eq!(record["item"], item.as_str(), "{record:#}");
    assert_eq!(record["task"], "The docs say the wrong port", "{record:#}");
    let url = match kind {
        Kind::Github => format!("{}/{item}", site.fake.github_git_url()).replace("#2", "/issues/2"),
        Kind::Gitlab => format!("{}/{item}", site.fake.gitlab_url()).replace("#2", "/-/issues/2"),
    };
    assert_eq!(record["url"], url.as_str(), "{record:#}");
    let shown = site.s.d.run(&["runs", "show", &answer_id]);
    assert!(
        shown.stdout.contains(&format!("for: {item} ({url})")),
        "{}",
        shown.stdout
    );
    assert!(shown.stdout.contains("task: The docs say the wrong port"));
    let listed = site.s.d.run(&["runs"]);
    assert!(
        listed
            .stdout
            .lines()
            .any(|l| l.contains(&answer_id) && l.contains(&item)),
        "{}",
        listed.stdout
    );

    // 3. The fix flow: a branch and a pull (merge) request into main, never merged.
    let a = site.label(kind, 3, "pi-fix", "d-fix-3");
    assert_eq!(a["status"], 202, "{a}");
    let fix_id = a["answer"]["jobs"][0].as_str().unwrap().to_owned();
    let fourth = site.work();
    let record = site.s.record(&fix_id);
    assert_eq!(
        record["outcome"], "completed",
        "{record:#}\n{}",
        fourth.stderr
    );
    let pulls = site.fake.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    let branch = format!("pi-dispatch/{fix_id}");
    let (head, base, url) = match kind {
        Kind::Github => (
            &pulls[0]["head"]["ref"],
            &pulls[0]["base"]["ref"],
            &pulls[0]["html_url"],
        ),
        Kind::Gitlab => (
            &pulls[0]["source_branch"],
            &pulls[0]["target_branch"],
            &pulls[0]["web_url"],
        ),
    };
    assert_eq!(
        (head.as_str(), base.as_str()),
        (Some(branch.as_str()), Some("main"))
    );
    assert_eq!(record["pullRequest"], *url);
    assert_eq!(
        site.fake
            .file_on(kind.name(), kind.repository(), &branch, "README.md")
            .as_deref(),
        Some("The service listens on port 8780.\n")
    );
    // main is as it was, and nothing asked to merge.
    assert_eq!(
        site.fake
            .file_on(kind.name(), kind.repository(), "main", "README.md")
            .as_deref(),
        Some(README)
    );
    assert_eq!(site.fake.merges(), 0);
    // Delivered: the job's clone and the rest of its folder are gone, its transcript is kept.
    let folder = site.s.d.path().join("state/jobs").join(&fix_id);
    let mut left: Vec<String> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["transcript.jsonl"], "{}", fourth.stderr);
    assert!(
        fourth.stderr.contains("job_folder_tidied"),
        "{}",
        fourth.stderr
    );
    let fix_comments = site.fake.comments(&kind.issue_key(3));
    assert_eq!(fix_comments.len(), 1, "{fix_comments:#?}");
    assert!(
        fix_comments[0].contains(url.as_str().unwrap()),
        "{fix_comments:#?}"
    );

    // 4. Stopped in the job by its MCP server: the comment gives the rule in a fixed sentence that
    // names no server, host or variable.
    let a = site.label(kind, 5, "broken", "d-broken-5");
    assert_eq!(a["status"], 202, "{a}");
    let broken_id = a["answer"]["jobs"][0].as_str().unwrap().to_owned();
    let fifth = site.work();
    let record = site.s.record(&broken_id);
    assert_eq!(
        record["reason"], "mcp-unavailable",
        "{record:#}\n{}",
        fifth.stderr
    );
    let stopped = site.fake.comments(&kind.issue_key(5));
    assert_eq!(stopped.len(), 1, "{stopped:#?}");
    assert!(stopped[0].contains("mcp-unavailable"), "{stopped:#?}");
    // (The hidden mark after it holds the job's id.)
    let sentence = stopped[0].split("<!--").next().unwrap();
    for word in ["broken", "false", "127.0.0.1", "http", "PI_", "TOKEN", "$"] {
        assert!(
            !sentence.contains(word),
            "the comment names {word}: {stopped:#?}"
        );
    }

    // The token reached the forge in a header only, and nothing kept a secret.
    let requests = site.fake.requests();
    assert!(
        requests
            .iter()
            .all(|r| !r.path.contains("CNRY") && !r.query.contains("CNRY"))
    );
    site.assert_no_secret_leaked(&[
        &first.stderr,
        &second.stderr,
        &third.stderr,
        &fourth.stderr,
        &fifth.stderr,
        &first.stdout,
        &third.stdout,
    ]);
}

#[test]
fn github_jobs_run_from_a_webhook_to_their_comment() {
    forge_jobs_run_from_a_webhook_to_their_comment(Kind::Github);
}

#[test]
fn gitlab_jobs_run_from_a_webhook_to_their_comment() {
    forge_jobs_run_from_a_webhook_to_their_comment(Kind::Gitlab);
}

/// The job's agent reaches the forge's own MCP server (GitHub's github-mcp-server, GitLab's
/// mcp-gitlab, behind the image's wrappers, pointed at the fake forge's API): it lists the
/// repository's issues from a codemode script, and the call reached the forge with the job's token.
fn the_agent_lists_issues_through_the_forge_server(kind: Kind) {
    let (repository, arguments) = match kind {
        Kind::Github => (
            "github:octo-org/hello",
            "{owner: 'octo-org', repo: 'hello'}",
        ),
        Kind::Gitlab => ("gitlab:15", "{project_id: '15'}"),
    };
    let script = vec![
        Step::call(
            "codemode",
            json!({"code": format!("const r = await tools.mcp__forge__list_issues({arguments}); return JSON.stringify(r);")}),
        ),
        Step::text("There is one open issue: Flaky login test."),
    ];
    let forge = testkit::forge_mcp_source();
    let triggers = json!({"triggers": [
        {"on": {"type": "label", "any": ["triage"]}, "run": {"kind": kind.name(), "flow": "answer", "mcp": ["forge"]}}
    ]});
    let site = Site::start(
        FakeForge::start_in_on_port_80,
        script,
        triggers,
        &["--forge-mcp", forge.to_str().unwrap()],
    );
    site.fake.set_issues(
        repository,
        vec![json!({"id": 501, "number": 7, "iid": 7, "project_id": 15, "title": "Flaky login test",
            "body": "It fails on Mondays.", "description": "It fails on Mondays.",
            "state": if kind == Kind::Github { "open" } else { "opened" },
            "user": {"login": "reporter"}, "author": {"id": 1, "username": "reporter", "name": "Reporter"},
            "labels": [], "assignees": [], "milestone": null, "closed_at": null,
            "web_url": "http://gitlab.example/group/sub/hello/-/issues/7",
            "created_at": "2026-11-30T10:00:00Z", "updated_at": "2026-11-30T10:00:00Z"})],
    );
    let image = std::fs::read_to_string(site.s.d.path().join("images/pi-job/image.json")).unwrap();
    assert!(image.contains("mcp,forgeMcp"), "{image}");

    let a = site.label(kind, 4, "triage", "d-triage-4");
    assert_eq!(a["status"], 202, "{a}");
    let id = a["answer"]["jobs"][0].as_str().unwrap().to_owned();
    let worked = site.work();
    let record = site.s.record(&id);
    let results = site.s.results();
    assert_eq!(
        record["outcome"], "completed",
        "{record:#}\n{}\n{results:#?}",
        worked.stderr
    );
    assert!(results[1].contains("Flaky login test"), "{results:#?}");
    let calls = record["mcp"]["toolCalls"].as_array().unwrap();
    assert!(
        calls
            .iter()
            .any(|c| c["server"] == "forge" && c["tool"] == "list_issues" && c["ok"] == 1),
        "{record:#}"
    );
    // The server asked the forge with the job's token, in a header.
    let (path, expected) = match kind {
        // The job's own token: the first minted for it.
        Kind::Github => ("/api/graphql", format!("Bearer {INSTALLATION_TOKEN}-1")),
        Kind::Gitlab => (
            "/gitlab/api/v4/projects/15/issues",
            format!("Bearer {GITLAB_TOKEN}"),
        ),
    };
    assert!(
        site.fake
            .requests()
            .iter()
            .any(|r| r.path == path && r.credential.as_deref() == Some(expected.as_str())),
        "{:#?}",
        site.fake.requests()
    );
    let comments = site.fake.comments(&kind.issue_key(4));
    assert_eq!(comments.len(), 1, "{comments:#?}");
    assert!(
        comments[0].starts_with("There is one open issue: Flaky login test."),
        "{comments:#?}"
    );
    site.assert_no_secret_leaked(&[&worked.stderr, &worked.stdout]);
}

#[test]
fn a_github_jobs_agent_lists_issues_through_github_mcp_server() {
    the_agent_lists_issues_through_the_forge_server(Kind::Github);
}

#[test]
fn a_gitlab_jobs_agent_lists_issues_through_mcp_gitlab() {
    the_agent_lists_issues_through_the_forge_server(Kind::Gitlab);
}

/// When a record's job ran: from its start to its end, in ms.
fn ran(record: &Value) -> (u64, u64) {
    (
        record["startedAtMs"].as_u64().unwrap(),
        record["finishedAtMs"].as_u64().unwrap(),
    )
}

/// Two deliveries for one issue, beside one for another, on a worker that runs two jobs at once:
/// the issue's two jobs run one after the other (the other issue's runs beside the first, which
/// proves two ran at once). With `"sameIssue": "cancel-older"`, a newer delivery cancels the
/// issue's job still queued, and only the newer runs.
#[test]
fn an_issues_jobs_never_overlap_and_a_newer_one_may_cancel_the_older() {
    let kind = Kind::Github;
    // Each job's first call sleeps 2 s; the rest answer at once, whichever job asks.
    let mut script = vec![Step::call("bash", json!({"command": "sleep 2; echo slept"})); 3];
    script.extend(vec![Step::text(ANSWER); 5]);
    let triggers = json!({"triggers": [
        {"on": {"type": "label", "any": ["pi-answer"]}, "run": {"kind": "github", "flow": "answer"}},
        {"on": {"type": "label", "any": ["pi-newest"]},
         "run": {"kind": "github", "flow": "answer", "sameIssue": "cancel-older"}},
    ]});
    let site = Site::start(FakeForge::start_in, script, triggers, &[]);
    let mut ids = Vec::new();
    for (number, delivery) in [(7, "d-7-a"), (7, "d-7-b"), (8, "d-8")] {
        let a = site.label(kind, number, "pi-answer", delivery);
        assert_eq!(a["status"], 202, "{a}");
        ids.push(a["answer"]["jobs"][0].as_str().unwrap().to_owned());
    }
    let run = Run::from(
        site.s
            .worker_command(&["--concurrency", "2"])
            .output()
            .unwrap(),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let records: Vec<Value> = ids.iter().map(|id| site.s.record(id)).collect();
    for r in &records {
        assert_eq!(r["outcome"], "completed", "{r:#}\n{}", run.stderr);
    }
    let (first, second, other) = (ran(&records[0]), ran(&records[1]), ran(&records[2]));
    assert!(
        first.1 <= second.0,
        "issue 7's jobs overlapped: {first:?} and {second:?}"
    );
    assert!(
        other.0 < first.1 && first.0 < other.1,
        "the control did not run two at once: {first:?} and {other:?}"
    );

    // Cancel-older: the first delivery's job is still queued when the second arrives.
    let older = site.label(kind, 9, "pi-newest", "d-9-a");
    let newer = site.label(kind, 9, "pi-newest", "d-9-b");
    let (older, newer) = (
        older["answer"]["jobs"][0].as_str().unwrap().to_owned(),
        newer["answer"]["jobs"][0].as_str().unwrap().to_owned(),
    );
    let status = site.s.d.run(&["status", "--json"]);
    let status: Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(status["counts"]["lost"], 1, "{status:#}");
    let run = site.work();
    let cancelled = site.s.record(&older);
    assert_eq!(cancelled["outcome"], "cancelled", "{cancelled:#}");
    assert_eq!(cancelled["budgetReserved"], false, "{cancelled:#}");
    assert!(
        cancelled["detail"]
            .to_string()
            .contains("a newer job for the same issue"),
        "{cancelled:#}"
    );
    let kept = site.s.record(&newer);
    assert_eq!(kept["outcome"], "completed", "{kept:#}\n{}", run.stderr);
}

/// A forge trigger tried by hand on an event saved to a file (a webhook's body, as the forge sends
/// it): read as the receiver reads it, its job runs and answers on that issue. An event the trigger
/// does not match queues nothing. The job then runs again with `rerun`, on the same event.
#[test]
fn a_forge_trigger_runs_on_an_event_from_a_file_and_again_with_rerun() {
    let kind = Kind::Github;
    let script = vec![Step::text(ANSWER), Step::text("Answered again.")];
    let site = Site::start(FakeForge::start_in, script, triggers(), &[]);
    let (_, body, _) = label_delivery(kind, 5, "pi-answer", "unused");
    let file = site.s.d.write("event.json", &body);
    // Trigger 1 is GitHub's pi-answer label trigger.
    let run = site
        .s
        .cli(&["run", "--trigger", "1", "--event", file.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = crate::worker::queued_id(&run);
    assert!(id.starts_with("gh-cli-"), "{id}");
    // Another label: trigger 1 does not match, and nothing is queued.
    let (_, other, _) = label_delivery(kind, 5, "docs", "unused");
    let other = site.s.d.write("other.json", &other);
    let refused = site
        .s
        .cli(&["run", "--trigger", "1", "--event", other.to_str().unwrap()]);
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    assert!(
        refused
            .stderr
            .contains("trigger 1 does not match this issues event"),
        "{}",
        refused.stderr
    );
    // Not a webhook body at all.
    let junk = site.s.d.write("junk.json", "{\"hello\": 1}");
    let junk = site
        .s
        .cli(&["run", "--trigger", "1", "--event", junk.to_str().unwrap()]);
    assert_eq!(junk.code, 1, "{}", junk.stderr);
    let worked = site.work();
    let record = site.s.record(&id);
    assert_eq!(
        record["outcome"], "completed",
        "{record:#}\n{}",
        worked.stderr
    );
    assert_eq!(record["item"], "octo-org/hello#5");
    let comments = site.fake.comments(&kind.issue_key(5));
    assert_eq!(comments.len(), 1, "{comments:#?}");
    assert!(comments[0].contains(ANSWER), "{}", comments[0]);

    // Run again: a new job on the same event, linked both ways.
    let again = site.s.cli(&["rerun", &id]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let new = again
        .stdout
        .split_whitespace()
        .nth(1)
        .unwrap()
        .trim_end_matches(',');
    assert_ne!(new, id);
    site.work();
    let rerun = site.s.record(new);
    assert_eq!(rerun["outcome"], "completed", "{rerun:#}");
    assert_eq!(rerun["rerunOf"], id.as_str());
    assert_eq!(rerun["item"], "octo-org/hello#5");
    assert_eq!(site.fake.comments(&kind.issue_key(5)).len(), 2);
    let shown = site.s.cli(&["runs", "show", &id]);
    assert!(
        shown.stdout.contains(&format!("run again as: {new}")),
        "{}",
        shown.stdout
    );
}
