//! What pi gets through the hub is what the server wrote, byte for byte as JSON: fields rmcp's
//! model does not know (server-everything's task tool has `execution`) included. Both ends are
//! read here without rmcp: the server directly (its stdio lines, its HTTP answers) and the hub
//! (its HTTP answers), by a bare client.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod http_support;
mod relay_support;

use std::process::Stdio;
use std::time::Duration;

use hub::connect::connect_transport;
use hub::http::{HttpPolicy, transport};
use hub::relay::{Hub, UpstreamEvents, Withheld, serve};
use relay_support::{TEST_TIMEOUT, everything, node, start_everything};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const TOKEN: &str = "raw-results-token-4d2c";

fn initialize_params() -> Value {
    json!({
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw-test", "version": "0"}
    })
}

/// A streamable-HTTP client with nothing of rmcp: a request's body in, its answer out (a JSON body,
/// or the message with the request's id in an event stream).
struct RawClient {
    http: reqwest::Client,
    url: String,
    token: Option<&'static str>,
    session: Option<String>,
    next: i64,
}

impl RawClient {
    async fn open(url: String, token: Option<&'static str>) -> RawClient {
        let mut client = RawClient {
            http: reqwest::Client::new(),
            url,
            token,
            session: None,
            next: 1,
        };
        let answer = client.request("initialize", initialize_params()).await;
        assert!(answer.get("result").is_some(), "{answer}");
        client
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        client
    }

    async fn post(&mut self, body: Value) -> (reqwest::header::HeaderMap, String) {
        let mut request = self
            .http
            .post(&self.url)
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json")
            .header("MCP-Protocol-Version", "2025-11-25")
            .body(body.to_string());
        if let Some(token) = self.token {
            request = request.bearer_auth(token);
        }
        if let Some(session) = &self.session {
            request = request.header("Mcp-Session-Id", session);
        }
        let response = request.send().await.unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        let headers = response.headers().clone();
        if let Some(session) = headers.get("mcp-session-id") {
            self.session = Some(session.to_str().unwrap().to_owned());
        }
        (headers, response.text().await.unwrap())
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let (headers, body) = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let is_stream = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !is_stream {
            return serde_json::from_str(&body).unwrap();
        }
        body.lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .find(|message| message.get("id") == Some(&json!(id)))
            .unwrap_or_else(|| panic!("no answer to {method} in the stream: {body}"))
    }
}

/// server-everything over stdio, spoken to directly: `tools/list`'s result as it printed it.
async fn tools_listed_over_stdio(dir: &std::path::Path) -> Value {
    let mut child = tokio::process::Command::new(node())
        .arg(everything())
        .arg("stdio")
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut answer_to = async |id: i64| loop {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("the server answers");
        let message: Value = serde_json::from_str(&line).unwrap();
        if message.get("id") == Some(&json!(id)) {
            return message;
        }
    };
    let send = |message: Value| format!("{message}\n");
    stdin
        .write_all(send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize_params()})).as_bytes())
        .await
        .unwrap();
    answer_to(1).await;
    stdin
        .write_all(
            send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).as_bytes(),
        )
        .await
        .unwrap();
    // Its tools that depend on the client are registered once it is initialized.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stdin
        .write_all(send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).as_bytes())
        .await
        .unwrap();
    let answer = answer_to(2).await;
    drop(stdin);
    let _ = child.kill().await;
    answer["result"].clone()
}

async fn hub_of(upstream: hub::connect::Upstream, withheld: Withheld) -> Hub {
    serve(vec![(upstream, withheld)], TOKEN.to_owned())
        .await
        .expect("the hub starts")
}

/// The tool named `name` in a `tools/list` result.
fn tool<'a>(listed: &'a Value, name: &str) -> Option<&'a Value> {
    listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_servers_tool_list_reaches_pi_as_the_server_wrote_it() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let direct = tools_listed_over_stdio(dir.path()).await;
        let task_tool = tool(&direct, "simulate-research-query")
            .expect("server-everything lists its task tool");
        assert_eq!(task_tool["execution"]["taskSupport"], "required");

        let upstream = start_everything("everything", UpstreamEvents::new(), dir.path()).await;
        let hub = hub_of(upstream, Withheld::new(["get-env"])).await;
        let mut pi = RawClient::open(hub.url("everything"), Some(TOKEN)).await;
        let relayed = pi.request("tools/list", json!({})).await;
        let relayed = &relayed["result"];

        // Everything but the withheld tool, each exactly as the server wrote it.
        let mut expected = direct.clone();
        expected["tools"]
            .as_array_mut()
            .unwrap()
            .retain(|t| t["name"] != "get-env");
        assert_eq!(*relayed, expected);
        assert!(tool(relayed, "get-env").is_none());
        assert_eq!(
            tool(relayed, "simulate-research-query").unwrap()["execution"]["taskSupport"],
            "required"
        );

        // A call's result too, and it is counted.
        let echoed = pi
            .request(
                "tools/call",
                json!({"name": "echo", "arguments": {"message": "raw"}}),
            )
            .await;
        assert_eq!(
            echoed["result"],
            json!({"content": [{"type": "text", "text": "Echo: raw"}]})
        );
        let counts = hub.tool_calls();
        assert!(
            counts
                .iter()
                .any(|c| c.tool == "echo" && c.calls == 1 && c.ok == 1 && c.result_bytes > 0),
            "{counts:?}"
        );
        hub.shutdown().await;
    })
    .await
    .expect("the test finishes in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_servers_tool_list_reaches_pi_as_the_server_wrote_it() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let server = testkit::EverythingHttp::start();
        let mut direct_client = RawClient::open(server.url(), None).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let direct = direct_client.request("tools/list", json!({})).await["result"].clone();
        assert_eq!(
            tool(&direct, "simulate-research-query").unwrap()["execution"]["taskSupport"],
            "required"
        );

        let (url, headers) = http_support::resolved(&server.url(), &[], &[]);
        let http = transport(&url, &headers, &HttpPolicy::default()).unwrap();
        let upstream = connect_transport(
            "everything",
            http.transport,
            UpstreamEvents::reading(http.raw),
        )
        .await
        .expect("the hub connects over HTTP");
        let hub = hub_of(upstream, Withheld::none()).await;
        let mut pi = RawClient::open(hub.url("everything"), Some(TOKEN)).await;
        let relayed = pi.request("tools/list", json!({})).await;
        assert_eq!(relayed["result"], direct);
        hub.shutdown().await;
    })
    .await
    .expect("the test finishes in time");
}
