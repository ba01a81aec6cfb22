//! The hub's endpoint seen by a bare HTTP client (no rmcp at either end): what pi gets is what the
//! server wrote, fields rmcp's model does not know (server-everything's task tool has `execution`)
//! included; answers are plain JSON unless something about the request comes first; sessions,
//! streams and foreign hosts are handled as the transport says.

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
    /// The `initialize` result.
    initialized: Value,
}

impl RawClient {
    async fn open(url: String, token: Option<&'static str>) -> RawClient {
        let mut client = RawClient {
            http: reqwest::Client::new(),
            url,
            token,
            session: None,
            next: 1,
            initialized: Value::Null,
        };
        let answer = client.request("initialize", initialize_params()).await;
        assert!(answer.get("result").is_some(), "{answer}");
        client.initialized = answer["result"].clone();
        client
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        client
    }

    async fn post(&mut self, body: Value) -> (reqwest::header::HeaderMap, String) {
        let request = self.build(body);
        let response = request.send().await.unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        let headers = response.headers().clone();
        if let Some(session) = headers.get("mcp-session-id") {
            self.session = Some(session.to_str().unwrap().to_owned());
        }
        (headers, response.text().await.unwrap())
    }

    /// Posts `body` and gives back the status only.
    async fn post_status(&mut self, body: Value) -> (reqwest::header::HeaderMap, u16) {
        let response = self.build(body).send().await.unwrap();
        (response.headers().clone(), response.status().as_u16())
    }

    fn build(&self, body: Value) -> reqwest::RequestBuilder {
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
        request
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
        stream_messages(&body)
            .into_iter()
            .find(|message| message.get("id") == Some(&json!(id)))
            .unwrap_or_else(|| panic!("no answer to {method} in the stream: {body}"))
    }
}

/// The messages of an event-stream body, in order.
fn stream_messages(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .collect()
}

/// server-everything over stdio, spoken to directly: the results of `initialize` and `tools/list`
/// as it printed them.
async fn talk_over_stdio(dir: &std::path::Path) -> (Value, Value) {
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
    let initialized = answer_to(1).await["result"].clone();
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
    (initialized, answer["result"].clone())
}

async fn bounded<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("the test finishes in time");
}

/// A hub serving a stdio server-everything (in a folder of its own, kept with the hub).
async fn everything_hub() -> (tempfile::TempDir, Hub) {
    let dir = tempfile::tempdir().unwrap();
    let upstream = start_everything("everything", UpstreamEvents::new(), dir.path()).await;
    (dir, hub_of(upstream, Withheld::none()).await)
}

/// The same, with pi's session open on it.
async fn everything_session() -> (tempfile::TempDir, Hub, RawClient) {
    let (dir, hub) = everything_hub().await;
    let pi = RawClient::open(hub.url("everything").unwrap(), Some(TOKEN)).await;
    (dir, hub, pi)
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
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let (direct_init, direct) = talk_over_stdio(dir.path()).await;
        let task_tool = tool(&direct, "simulate-research-query")
            .expect("server-everything lists its task tool");
        assert_eq!(task_tool["execution"]["taskSupport"], "required");

        let upstream = start_everything("everything", UpstreamEvents::new(), dir.path()).await;
        let hub = hub_of(upstream, Withheld::new(["get-env"])).await;
        let mut pi = RawClient::open(hub.url("everything").unwrap(), Some(TOKEN)).await;
        // The hub answers initialize itself, with the server's own answer: `capabilities.tasks`,
        // which rmcp's model has no field for, included.
        assert!(
            direct_init["capabilities"].get("tasks").is_some(),
            "{direct_init}"
        );
        assert_eq!(pi.initialized, direct_init);
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
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_servers_tool_list_reaches_pi_as_the_server_wrote_it() {
    bounded(async {
        let server = testkit::EverythingHttp::start();
        let mut direct_client = RawClient::open(server.url(), None).await;
        let direct_init = direct_client.initialized.clone();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let direct = direct_client.request("tools/list", json!({})).await["result"].clone();
        assert_eq!(
            tool(&direct, "simulate-research-query").unwrap()["execution"]["taskSupport"],
            "required"
        );

        let (url, headers) = http_support::resolved(&server.url(), &[], &[]);
        let http = transport(&url, &headers, &HttpPolicy::default()).unwrap();
        let upstream = connect_transport("everything", http.transport, UpstreamEvents::new())
            .await
            .expect("the hub connects over HTTP");
        let hub = hub_of(upstream, Withheld::none()).await;
        let mut pi = RawClient::open(hub.url("everything").unwrap(), Some(TOKEN)).await;
        assert_eq!(pi.initialized, direct_init);
        let relayed = pi.request("tools/list", json!({})).await;
        assert_eq!(relayed["result"], direct);
        hub.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_json_unless_progress_comes_first() {
    bounded(async {
        let (_dir, hub, mut pi) = everything_session().await;

        let (headers, body) = pi
            .post(json!({"jsonrpc": "2.0", "id": 10, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"message": "plain"}}}))
            .await;
        assert_eq!(headers["content-type"], "application/json");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["id"], 10);
        assert_eq!(answer["result"]["content"][0]["text"], "Echo: plain");

        // A long operation with a progress token: its progress, then its result, on one stream.
        let (headers, body) = pi
            .post(json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call",
                "params": {"name": "trigger-long-running-operation",
                    "arguments": {"duration": 1, "steps": 3},
                    "_meta": {"progressToken": "pi-token-7"}}}))
            .await;
        assert!(
            headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        let messages = stream_messages(&body);
        let (last, progress) = messages.split_last().unwrap();
        assert_eq!(last["id"], 11, "the result comes last: {body}");
        assert!(last.get("result").is_some());
        assert_eq!(progress.len(), 3, "{body}");
        for p in progress {
            assert_eq!(p["method"], "notifications/progress");
            assert_eq!(p["params"]["progressToken"], "pi-token-7");
        }
        hub.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_streams_and_hosts_are_checked() {
    bounded(async {
        let (_dir, hub) = everything_hub().await;
        let url = hub.url("everything").unwrap();
        let http = reqwest::Client::new();
        let post = |session: Option<&str>| {
            let mut r = http
                .post(&url)
                .bearer_auth(TOKEN)
                .header("Accept", "application/json, text/event-stream")
                .header("Content-Type", "application/json")
                .body(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string());
            if let Some(s) = session {
                r = r.header("Mcp-Session-Id", s);
            }
            r
        };
        // No session, or one that does not exist.
        assert_eq!(post(None).send().await.unwrap().status(), 400);
        assert_eq!(
            post(Some("no-such-session")).send().await.unwrap().status(),
            404
        );

        let pi = RawClient::open(url.clone(), Some(TOKEN)).await;
        let session = pi.session.clone().unwrap();
        assert_eq!(session.len(), 32);
        assert_eq!(post(Some(&session)).send().await.unwrap().status(), 200);

        // One session stream at a time.
        let get = || {
            http.get(&url)
                .bearer_auth(TOKEN)
                .header("Accept", "text/event-stream")
                .header("Mcp-Session-Id", &session)
        };
        let stream = get().send().await.unwrap();
        assert_eq!(stream.status(), 200);
        assert_eq!(stream.headers()["content-type"], "text/event-stream");
        assert_eq!(get().send().await.unwrap().status(), 409);
        drop(stream);

        // Another host, or a page from another origin, is turned away even with the token.
        for (name, value) in [("Host", "evil.example"), ("Origin", "http://evil.example")] {
            let refused = post(Some(&session))
                .header(name, value)
                .send()
                .await
                .unwrap();
            assert_eq!(refused.status(), 403, "{name}");
        }
        let local = post(Some(&session))
            .header("Origin", "http://localhost:5173")
            .send()
            .await
            .unwrap();
        assert_eq!(local.status(), 200);

        // Deleted: gone.
        let deleted = http
            .delete(&url)
            .bearer_auth(TOKEN)
            .header("Mcp-Session-Id", &session)
            .send()
            .await
            .unwrap();
        assert_eq!(deleted.status(), 200);
        assert_eq!(post(Some(&session)).send().await.unwrap().status(), 404);
        hub.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_s_request_reaches_the_server_as_pi_wrote_it() {
    bounded(async {
        let server = http_support::FaultServer::start().await;
        let (url, headers) = http_support::resolved(&format!("{}/x/mcp", server.base()), &[], &[]);
        let http = transport(&url, &headers, &HttpPolicy::default()).unwrap();
        let upstream = connect_transport("fault", http.transport, UpstreamEvents::new())
            .await
            .expect("the hub connects");
        let hub = hub_of(upstream, Withheld::none()).await;
        let mut pi = RawClient::open(hub.url("fault").unwrap(), Some(TOKEN)).await;
        let params = json!({"name": "echo", "arguments": {"message": "as written"},
            "x-extra": {"ttl": 60000}, "_meta": {"trace": "t-1", "progressToken": "pi-7"}});
        let answer = pi.request("tools/call", params.clone()).await;
        assert_eq!(answer["result"]["content"][0]["text"], "Echo: as written");
        let call = server
            .seen()
            .into_iter()
            .find(|s| s.rpc_method().as_deref() == Some("tools/call"))
            .expect("the call reached the server");
        let sent: Value = serde_json::from_str(&call.body).unwrap();
        // The hub's own id, and its own progress token (the same number): the sessions sharing
        // the server never mix up theirs.
        let hub_id = sent["id"].as_u64().expect("an id of the hub's");
        assert_eq!(sent["params"]["_meta"]["progressToken"], hub_id);
        // Everything else as pi wrote it: a field nobody models, pi's own `_meta`, nothing added.
        let mut expected = params;
        expected["_meta"]["progressToken"] = json!(hub_id);
        assert_eq!(sent["params"], expected);
        let mut members: Vec<&String> = sent.as_object().unwrap().keys().collect();
        members.sort();
        assert_eq!(members, ["id", "jsonrpc", "method", "params"]);
        hub.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_call_becomes_a_stream_and_odd_requests_are_refused_and_counted() {
    bounded(async {
        let (_dir, hub, mut pi) = everything_session().await;

        // No progress asked for, but the answer takes longer than the hub waits before sending
        // headers: an event stream, with the result.
        let (headers, body) = pi
            .post(json!({"jsonrpc": "2.0", "id": 20, "method": "tools/call",
                "params": {"name": "trigger-long-running-operation",
                    "arguments": {"duration": 7, "steps": 1}}}))
            .await;
        assert!(
            headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        let answer = stream_messages(&body)
            .into_iter()
            .find(|m| m["id"] == 20)
            .unwrap_or_else(|| panic!("no answer: {body}"));
        assert!(answer.get("result").is_some(), "{answer}");

        // A call whose params rmcp cannot carry is refused, and counted as refused.
        let refused = pi
            .request(
                "tools/call",
                json!({"name": "echo", "arguments": {}, "_meta": "text"}),
            )
            .await;
        assert_eq!(refused["error"]["code"], -32600, "{refused}");
        let counts = hub.tool_calls();
        assert!(
            counts.iter().any(|c| c.tool == "echo" && c.refused == 1),
            "{counts:?}"
        );

        // A null id is not an id.
        let (_, body) = pi
            .post_status(json!({"jsonrpc": "2.0", "id": null, "method": "tools/list"}))
            .await;
        assert_eq!(body, 400);
        hub.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_sharing_a_server_keep_their_own_ids_and_tokens() {
    bounded(async {
        let (_dir, hub, mut first) = everything_session().await;
        let mut second = RawClient::open(hub.url("everything").unwrap(), Some(TOKEN)).await;
        // The same id and the same progress token, at the same time, on one upstream connection.
        let call = |steps: u32| {
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "trigger-long-running-operation",
                    "arguments": {"duration": 1, "steps": steps},
                    "_meta": {"progressToken": "t"}}})
        };
        let ((_, one), (_, two)) = tokio::join!(first.post(call(2)), second.post(call(3)));
        for (body, steps) in [(one, 2), (two, 3)] {
            let messages = stream_messages(&body);
            let (last, progress) = messages.split_last().unwrap();
            assert_eq!(last["id"], 7, "{body}");
            let text = last["result"]["content"][0]["text"].as_str().unwrap();
            assert!(text.contains(&format!("Steps: {steps}.")), "{text}");
            assert_eq!(progress.len(), steps as usize, "{body}");
            for p in progress {
                assert_eq!(p["params"]["progressToken"], "t");
                assert_eq!(p["params"]["total"], steps);
            }
        }
        hub.shutdown().await;
    })
    .await;
}
