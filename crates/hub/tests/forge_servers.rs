//! The forge's own MCP servers for real, behind the wrappers `image install --forge-mcp` writes:
//! GitHub's github-mcp-server and GitLab's mcp-gitlab, each pointed at the fake forge's API on
//! loopback, started as the runner starts a job's forge entry and served to a real MCP client by
//! the hub. The withheld tools are never listed, and a call to one never reaches the forge.

// Test code fails loudly on purpose; the workspace denies unwrap only in product code.
#![allow(clippy::unwrap_used, clippy::expect_used, deprecated)]

mod http_support;
mod relay_support;

use std::path::Path;

use hub::connect::{Upstream, connect_stdio};
use hub::relay::{GITHUB_WITHHELD, GITLAB_WITHHELD, UpstreamEvents, Withheld};
use hub::resolve::{Resolved, resolve};
use hub::stdio::environment;
use protocol::job_mcp::{Forge, JobMcpFile};
use relay_support::*;
use rmcp::ServiceError;
use rmcp::model::{CallToolRequestParams, ClientCapabilities, ErrorCode};
use serde_json::json;
use testkit::fake_forge::{FakeForge, FakeForgeSetup};

const TOKEN: &str = "hub-test-token-0123456789";
const INSTALLATION_TOKEN: &str = "ghs_CNRY-forge-server-token-77e0";
const GITLAB_TOKEN: &str = "glpat-CNRY-forge-server-token-1b3f";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Github,
    Gitlab,
}

fn fake() -> FakeForge {
    // The App key is not used here: the test holds the installation token already.
    FakeForge::start_on_port_80(FakeForgeSetup {
        app_id: 1,
        app_public_key: Vec::new(),
        installation_token: INSTALLATION_TOKEN.into(),
        gitlab_token: GITLAB_TOKEN.into(),
    })
}

/// The image's forge servers, laid out by the product's own `image install --forge-mcp` step.
fn image() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    setup::forge_mcp::stage(&testkit::forge_mcp_source(), dir.path(), None)
        .expect("the pinned forge servers are laid out");
    dir
}

/// The forge server of `kind` started as the runner starts a job's forge entry: the wrapper, with
/// the runner's base environment (Node.js first on PATH, as in a job) and the entry's own variables.
async fn start_forge(kind: Kind, fake: &FakeForge, image: &Path, dir: &Path) -> Upstream {
    let node_bin = testkit::node().parent().unwrap().to_owned();
    let mut runner = runner_env(dir);
    for (k, v) in &mut runner {
        if k == "PATH" {
            *v = format!("{}:{v}", node_bin.display());
        }
    }
    // What a job's runner holds besides: the token under its CLI names, which the server must not get.
    runner.push(("GITHUB_TOKEN".into(), "cnry-forge-cli-token".into()));
    runner.push(("GITLAB_TOKEN".into(), "cnry-forge-cli-token".into()));
    // The forge entry as the worker writes it into /job/mcp.json, read and resolved as the runner
    // does, from the job's own variables.
    let (forge, wrapper) = match kind {
        Kind::Github => (
            Forge::Github {
                host: Some(fake.url()),
            },
            "forge-mcp-github",
        ),
        Kind::Gitlab => (
            Forge::Gitlab {
                api_url: format!("{}/api/v4", fake.gitlab_url()),
            },
            "forge-mcp-gitlab",
        ),
    };
    let file = JobMcpFile::new(&[], Some(&forge), false);
    let job = hub::job_file::read(file.text.as_bytes(), Some(&file.digest)).unwrap();
    let job_env = |name: &str| match name {
        "GH_TOKEN" => Some(INSTALLATION_TOKEN.to_owned()),
        "GITLAB_TOKEN" => Some(GITLAB_TOKEN.to_owned()),
        _ => None,
    };
    let Resolved::Stdio { env: own, .. } = resolve(&job.servers[0], &job_env).unwrap() else {
        panic!("the forge entry is a stdio server")
    };
    let env = environment(&runner, &own);
    let command = image.join("forge-mcp").join(wrapper);
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        connect_stdio("forge", &command, &[], &env, dir, UpstreamEvents::new()),
    )
    .await
    .expect("the forge server answers within a minute")
    .unwrap_or_else(|e| {
        panic!(
            "the forge server did not connect: {e} ({})",
            e.stderr_tail()
        )
    })
}

fn call(name: &str, arguments: serde_json::Value) -> CallToolRequestParams {
    CallToolRequestParams::new(name.to_owned())
        .with_arguments(arguments.as_object().cloned().unwrap())
}

async fn the_forge_server_lists_issues_and_never_passes_a_withheld_call(kind: Kind) {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let fake = fake();
        fake.set_issues(
            "github:octo-org/hello",
            vec![json!({"id": 501, "number": 7, "title": "Flaky login test", "body": "It fails on Mondays.",
                "state": "open", "user": {"login": "reporter"}})],
        );
        fake.set_issues(
            "gitlab:15",
            vec![json!({"id": 601, "iid": 7, "project_id": 15, "title": "Flaky login test",
                "description": "It fails on Mondays.", "state": "opened",
                "author": {"id": 1, "username": "reporter", "name": "Reporter"},
                "labels": [], "assignees": [], "milestone": null, "closed_at": null,
                "web_url": "http://gitlab.example/group/sub/hello/-/issues/7",
                "created_at": "2026-11-30T10:00:00Z", "updated_at": "2026-11-30T10:00:00Z"})],
        );
        let image = image();
        let dir = tempfile::tempdir().unwrap();
        let upstream = start_forge(kind, &fake, image.path(), dir.path()).await;
        let listed: Vec<String> = upstream.tools.iter().map(|t| t.name.to_string()).collect();
        let withheld: &[&str] = match kind {
            Kind::Github => &GITHUB_WITHHELD,
            Kind::Gitlab => &GITLAB_WITHHELD,
        };
        // The pinned server offers each tool the job withholds that its version has: all but
        // pull_request_review_write (github-mcp-server 0.12.1 submits a review with
        // create_and_submit_pull_request_review and submit_pending_pull_request_review instead),
        // and for mcp-gitlab 2.1.64 all but approve_deployment and execute_graphql, which it does
        // not have.
        let offered: Vec<&str> = withheld
            .iter()
            .copied()
            .filter(|w| listed.iter().any(|l| l == w))
            .collect();
        let absent: &[&str] = match kind {
            Kind::Github => &["pull_request_review_write"],
            Kind::Gitlab => &["approve_deployment", "execute_graphql"],
        };
        let expected: Vec<&str> = withheld
            .iter()
            .copied()
            .filter(|w| !absent.contains(w))
            .collect();
        assert_eq!(offered, expected, "the server's list: {listed:?}");
        // The server has the token it was given, and not the token under its CLI names, the
        // provider's key or anything else of the runner's.
        let holders = testkit::processes_with(match kind {
            Kind::Github => INSTALLATION_TOKEN,
            Kind::Gitlab => GITLAB_TOKEN,
        });
        assert!(!holders.is_empty(), "no process holds the forge server's token");
        for (pid, _) in &holders {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let environ = String::from_utf8_lossy(&environ);
            for leak in ["cnry-forge-cli-token", "cnry-forge-token", "cnry-provider-key"] {
                assert!(!environ.contains(leak), "the forge server was given {leak}");
            }
        }

        let hub = serve_both_ways(
            vec![(
                upstream,
                match kind {
                    Kind::Github => Withheld::github(),
                    Kind::Gitlab => Withheld::gitlab(),
                },
            )],
            TOKEN,
        )
        .await;
        let (client, _seen) =
            connect_via(&hub, Via::Relay, "forge", TOKEN, ClientCapabilities::default()).await;

        // Never listed.
        let relayed: Vec<String> = client
            .list_all_tools()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        for w in withheld {
            assert!(!relayed.iter().any(|r| r == w), "{w} was listed");
        }
        assert!(relayed.iter().any(|r| r == "list_issues"), "{relayed:?}");

        // The agent's way in: list_issues reaches the forge with the token, in a header.
        let arguments = match kind {
            Kind::Github => json!({"owner": "octo-org", "repo": "hello"}),
            Kind::Gitlab => json!({"project_id": "15"}),
        };
        let issues = client.call_tool(call("list_issues", arguments)).await.unwrap();
        let text = serde_json::to_string(&issues.content).unwrap();
        assert!(
            text.contains("Flaky login test") && issues.is_error != Some(true),
            "{text}"
        );
        let before = fake.requests();
        let asked = before.last().unwrap();
        assert!(
            asked.path.ends_with("/api/graphql") || asked.path.ends_with("/projects/15/issues"),
            "{asked:?}"
        );
        let expected = match kind {
            Kind::Github => format!("Bearer {INSTALLATION_TOKEN}"),
            Kind::Gitlab => GITLAB_TOKEN.to_owned(),
        };
        assert!(
            asked.credential.as_deref() == Some(expected.as_str())
                || asked.credential.as_deref() == Some(format!("Bearer {GITLAB_TOKEN}").as_str()),
            "{:?}",
            asked.credential
        );

        // Every withheld tool, called by name, is refused before it reaches the server: the
        // forge sees no request.
        for w in withheld {
            let refused = match client
                .call_tool(call(w, json!({"owner": "octo-org", "repo": "hello", "pullNumber": 1,
                    "project_id": "15", "merge_request_iid": "1"})))
                .await
                .unwrap_err()
            {
                ServiceError::McpError(e) => e,
                other => panic!("expected a JSON-RPC error, got {other}"),
            };
            assert_eq!(refused.code, ErrorCode::INVALID_PARAMS, "{w}");
        }
        assert_eq!(fake.requests().len(), before.len(), "a withheld call reached the forge");
        assert_eq!(fake.merges(), 0);
        hub.shutdown().await;
    })
    .await
    .expect("the test finishes in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_mcp_server_lists_issues_and_never_passes_a_withheld_call() {
    the_forge_server_lists_issues_and_never_passes_a_withheld_call(Kind::Github).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_gitlab_lists_issues_and_never_passes_a_withheld_call() {
    the_forge_server_lists_issues_and_never_passes_a_withheld_call(Kind::Gitlab).await;
}
