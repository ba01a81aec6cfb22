//! Starting a stdio server the way the runner does, with real processes: its environment, its
//! handshake, its process group, and what a failure says.

// Test code fails loudly on purpose; the workspace denies unwrap only in product code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod relay_support;

use std::path::Path;
use std::time::Duration;

use hub::connect::{ConnectFailure, connect_stdio};
use hub::relay::UpstreamEvents;
use hub::stdio::environment;
use relay_support::*;
use rmcp::model::CallToolRequestParams;

async fn bounded<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("the test finishes in time");
}

fn sh(script: &str, rest: &[&str]) -> Vec<String> {
    ["-c", script]
        .iter()
        .chain(rest)
        .map(|s| s.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_sees_only_its_environment_and_lists_its_tools() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let upstream = start_everything("everything", UpstreamEvents::new(), dir.path()).await;
        assert_eq!(upstream.name, "everything");
        assert!(upstream.tools.len() > 5, "{:?}", upstream.tools);
        assert!(upstream.ready_after > Duration::ZERO);
        assert_eq!(upstream.protocol_version(), "2025-11-25");
        assert!(
            upstream
                .stderr_tail()
                .contains("Starting default (STDIO) server")
        );
        assert!(!upstream.is_closed());

        let env = direct(&upstream)
            .call_tool(CallToolRequestParams::new("get-env"))
            .await
            .unwrap();
        let text: String = env
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect();
        let seen: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut names: Vec<&str> = seen
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        names.sort_unstable();
        assert_eq!(names, ["HOME", "PATH"], "{text}");
        assert!(!text.contains("cnry"), "{text}");
        assert_eq!(seen["HOME"], dir.path().to_str().unwrap());
        upstream.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handshake_announces_2025_11_25_as_pi_dispatch_hub() {
    bounded(async {
        // A process that records the first line it is sent and exits: no MCP server at all.
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("first-line");
        let args = sh(
            r#"read -r line; printf '%s' "$line" > "$0""#,
            &[record.to_str().unwrap()],
        );
        let env = environment(&runner_env(dir.path()), &[]);
        let error = connect_stdio(
            "recorder",
            Path::new("/bin/sh"),
            &args,
            &env,
            dir.path(),
            UpstreamEvents::new(),
        )
        .await
        .unwrap_err();
        assert_eq!(error.failure, ConnectFailure::Exited("answered initialize"));
        let sent: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
        assert_eq!(sent["method"], "initialize");
        assert_eq!(sent["params"]["protocolVersion"], "2025-11-25");
        assert_eq!(sent["params"]["clientInfo"]["name"], "pi-dispatch-hub");
        assert_eq!(sent["params"]["capabilities"], serde_json::json!({}));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_upstream_takes_its_whole_process_group() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let upstream =
            start_everything_with_a_sibling("everything", UpstreamEvents::new(), dir.path()).await;
        let group = upstream.process_group().unwrap();
        let members = group_members(group);
        assert!(members.len() >= 2, "{members:?}");
        assert_ne!(
            group,
            std::process::id() as i32,
            "the server has a group of its own"
        );

        drop(upstream);
        let left = wait_group_gone(group, Duration::from_secs(10)).await;
        assert!(left.is_empty(), "still running in the group: {left:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_said_in_words_without_a_value() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let secret_env = vec![
            ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
            ("SERVER_TOKEN".to_owned(), "cnry-env-value".to_owned()),
        ];
        let start = |command: &'static str, args: Vec<String>| {
            let env = secret_env.clone();
            let dir = dir.path().to_owned();
            async move {
                connect_stdio(
                    "failing",
                    Path::new(command),
                    &args,
                    &env,
                    &dir,
                    UpstreamEvents::new(),
                )
                .await
                .unwrap_err()
            }
        };

        // A command that is not there.
        let missing = start("/nonexistent/cnry-command", vec!["--token=cnry-arg".to_owned()]).await;
        assert!(matches!(missing.failure, ConnectFailure::NotStarted(_)), "{missing}");

        // A server that prints to stderr and exits before answering.
        let exits = start(
            "/bin/sh",
            sh(
                "echo \"cnry-stderr: $SERVER_TOKEN\" >&2; exit 3",
                &["cnry-arg"],
            ),
        )
        .await;
        assert_eq!(exits.failure, ConnectFailure::Exited("answered initialize"));
        assert!(
            exits.stderr_tail().contains("cnry-stderr: cnry-env-value"),
            "the tail is kept for the diagnosis: {:?}",
            exits.stderr_tail()
        );

        // A server that answers initialize with an error echoing a value.
        let error_reply = r#"read -r line; echo '{"jsonrpc":"2.0","id":0,"error":{"code":-32000,"message":"bad token cnry-env-value"}}'; sleep 5"#;
        let refuses = start("/bin/sh", sh(error_reply, &[])).await;
        assert_eq!(
            refuses.failure,
            ConnectFailure::Handshake("the server answered initialize with error -32000".to_owned())
        );

        for error in [&missing, &exits, &refuses] {
            let said = format!("{error} {error:?}");
            assert!(!said.contains("cnry"), "{said}");
            assert_eq!(error.server, "failing");
        }
    })
    .await;
}

/// A stdio server whose `big` tool answers with one line of 17 MiB (its id last, as the TypeScript
/// SDK writes it), and whose `echo` answers as usual.
const BIG_LINE_SERVER: &str = r#"
const answer = (id, result) => process.stdout.write(JSON.stringify({ jsonrpc: "2.0", id, result }) + "\n");
require("readline").createInterface({ input: process.stdin }).on("line", (line) => {
  const m = JSON.parse(line);
  if (m.id === undefined) return;
  if (m.method === "initialize") {
    return answer(m.id, { protocolVersion: "2025-11-25", capabilities: { tools: {} },
      serverInfo: { name: "big", version: "1" } });
  }
  if (m.method === "tools/list") {
    return answer(m.id, { tools: [{ name: "big", inputSchema: { type: "object" } },
                                  { name: "echo", inputSchema: { type: "object" } }] });
  }
  if (m.params.name === "big") {
    const text = "x".repeat(17 * 1024 * 1024);
    process.stdout.write('{"result":{"content":[{"type":"text","text":"' + text +
      '"}]},"jsonrpc":"2.0","id":' + JSON.stringify(m.id) + "}\n");
    return;
  }
  answer(m.id, { content: [{ type: "text", text: "small" }] });
});
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_16_mib_fails_its_request_and_the_connection_goes_on() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let env = environment(&runner_env(dir.path()), &[]);
        let args = vec!["-e".to_owned(), BIG_LINE_SERVER.to_owned()];
        let upstream = connect_stdio(
            "big",
            &node(),
            &args,
            &env,
            dir.path(),
            UpstreamEvents::new(),
        )
        .await
        .unwrap_or_else(|e| panic!("{e} ({})", e.stderr_tail()));
        let (_, peak_before) = peak_rss();
        let big = tokio::time::timeout(
            Duration::from_secs(30),
            upstream
                .peer
                .request("tools/call", serde_json::json!({"name": "big"})),
        )
        .await
        .expect("the request fails rather than waits");
        assert_eq!(
            big,
            Err(hub::rpc::RpcError::Transport(
                hub::http::Refusal::BodyTooLarge(16 * 1024 * 1024)
            ))
        );
        let (_, peak_after) = peak_rss();
        // The line is read through, not held: the 16 MiB before the limit at most.
        assert!(
            peak_after.saturating_sub(peak_before) < 40 * 1024 * 1024,
            "the test process grew by {} bytes",
            peak_after - peak_before
        );
        let small = upstream
            .peer
            .request("tools/call", serde_json::json!({"name": "echo"}))
            .await
            .unwrap();
        assert_eq!(small["content"][0]["text"], "small");
        upstream.shutdown().await;
    })
    .await;
}

/// The test process's resident memory now and at its peak, bytes.
fn peak_rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}
