//! A server newer than anything the hub knows: a hand-written MCP server (a Node script, the same
//! one over stdio and over streamable HTTP) whose every message carries fields no model has —
//! `capabilities.tasks`, a tool's `execution`, and invented fields in a result, in a tool, in a
//! notification's params and in its own request's params. pi's side, a bare HTTP client, must get
//! each of them exactly as the server wrote it, and the server must get pi's answer to its request
//! exactly as pi wrote it. The server's ping is answered by the hub, and a request the server
//! cancels is cancelled at pi under the hub's id for it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod http_support;
mod relay_support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use hub::connect::{Upstream, connect_stdio, connect_transport};
use hub::http::{HttpPolicy, transport};
use hub::relay::{Hub, UpstreamEvents, Withheld, serve};
use relay_support::{TEST_TIMEOUT, node};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const TOKEN: &str = "future-fields-token-31c9";

/// What the server answers and sends; the test holds pi's side to it.
fn fixtures() -> Value {
    json!({
        "initialize": {
            "protocolVersion": "2025-11-25",
            "capabilities": {
                "tools": {"listChanged": true},
                "logging": {},
                "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}},
                "futureCapability": {"x": [1, 2, {"y": null}]}
            },
            "serverInfo": {"name": "future-server", "version": "9.9.9", "futureInfo": {"a": 1}},
            "instructions": "A server from the future.",
            "futureResultField": {"nested": {"deep": true}}
        },
        "tools": {
            "tools": [
                {
                    "name": "echo",
                    "description": "Echoes, with fields from the future",
                    "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}},
                    "execution": {"taskSupport": "optional"},
                    "futureToolField": {"k": [1, {"z": null}], "s": "ü \"quoted\""}
                },
                {"name": "cancels", "inputSchema": {"type": "object"}},
                {
                    "name": "kept-back",
                    "inputSchema": {"type": "object"},
                    "execution": {"taskSupport": "required"}
                }
            ],
            "futureListField": 7
        },
        "notification": {
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": "info", "logger": "future", "data": {"said": "hello"},
                       "futureNotificationField": {"n": 1}}
        },
        "custom": {
            "jsonrpc": "2.0",
            "method": "notifications/future/thing",
            "params": {"anything": [true, 2.5, "three"]}
        },
        "request": {
            "method": "sampling/createMessage",
            "params": {
                "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
                "maxTokens": 5,
                "futureRequestField": {"r": true},
                "_meta": {"futureMeta": "m"}
            }
        },
        "elicit": {"message": "Which?", "requestedSchema": {"type": "object"}, "futureElicit": 1},
        "result": {
            "content": [{"type": "text", "text": "done", "futureContentField": 1}],
            "structuredContent": {"a": 1},
            "futureCallField": {"c": "d"}
        }
    })
}

/// pi's answer to the server's request, with a field of its own.
fn sampled() -> Value {
    json!({
        "role": "assistant",
        "content": {"type": "text", "text": "sampled"},
        "model": "test-model",
        "futureAnswerField": {"from": "pi"}
    })
}

/// The server: over stdio (no arguments) or over streamable HTTP (`http PORT`). A call of `echo`
/// pings, sends a notification, a custom one and a request of its own, waits for the answer, then
/// answers with its result and, under `sampled` and `pinged`, the results it got back. A call of
/// `cancels` sends a request, cancels it, and answers.
const SERVER: &str = r#"
const fs = require("fs");
const f = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const waiting = new Map();
function answer(id, result) { return { jsonrpc: "2.0", id, result }; }
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
function ask(id, method, params, send) {
  const answered = new Promise((resolve) => waiting.set(id, resolve));
  send({ jsonrpc: "2.0", id, method, params });
  return answered;
}
async function call(m, send) {
  if (m.params.name === "cancels") {
    send({ jsonrpc: "2.0", id: "srv-2", method: "elicitation/create", params: f.elicit });
    await sleep(300);
    send({ jsonrpc: "2.0", method: "notifications/cancelled",
           params: { requestId: "srv-2", reason: "changed its mind" } });
    await sleep(300);
    send(answer(m.id, { content: [{ type: "text", text: "cancelled" }] }));
    return;
  }
  const pong = await ask("srv-ping", "ping", undefined, send);
  send(f.notification);
  send(f.custom);
  const got = await ask("srv-1", f.request.method, f.request.params, send);
  send(answer(m.id, Object.assign({}, f.result, { sampled: got.result, pinged: pong.result })));
}
// What answers a message, or null for none; `send` carries what comes before it.
async function handle(m, send) {
  if (m.method === undefined) {
    const resolve = waiting.get(m.id);
    if (resolve) { waiting.delete(m.id); resolve(m); }
    return null;
  }
  if (m.id === undefined) return null;
  if (m.method === "initialize") return answer(m.id, f.initialize);
  if (m.method === "tools/list") return answer(m.id, f.tools);
  if (m.method === "tools/call") { await call(m, send); return undefined; }
  return { jsonrpc: "2.0", id: m.id, error: { code: -32601, message: "no" } };
}
if (process.argv[3] === "http") {
  require("http").createServer((req, res) => {
    if (req.method === "GET") { res.writeHead(405); res.end(); return; }
    if (req.method === "DELETE") { res.writeHead(200); res.end(); return; }
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", async () => {
      const m = JSON.parse(body);
      if (m.id === undefined || m.method === undefined) {
        res.writeHead(202); res.end(); handle(m, () => {}); return;
      }
      const headers = { "Content-Type": "text/event-stream", "Mcp-Session-Id": "future-session" };
      res.writeHead(200, headers);
      const send = (x) => res.write("event: message\ndata: " + JSON.stringify(x) + "\n\n");
      const out = await handle(m, send);
      if (out) send(out);
      res.end();
    });
  }).listen(Number(process.argv[4]), "127.0.0.1", () => console.error("listening"));
} else {
  const send = (x) => process.stdout.write(JSON.stringify(x) + "\n");
  require("readline").createInterface({ input: process.stdin }).on("line", async (line) => {
    const out = await handle(JSON.parse(line), send);
    if (out) send(out);
  });
}
"#;

/// Writes the server and its fixtures into `dir`; returns the node arguments.
fn server_args(dir: &Path) -> Vec<String> {
    let script = dir.join("future-server.js");
    let fixtures_file = dir.join("fixtures.json");
    std::fs::write(&script, SERVER).unwrap();
    std::fs::write(&fixtures_file, fixtures().to_string()).unwrap();
    vec![
        script.to_str().unwrap().to_owned(),
        fixtures_file.to_str().unwrap().to_owned(),
    ]
}

async fn over_stdio(dir: &Path) -> Upstream {
    let env = hub::stdio::environment(&relay_support::runner_env(dir), &[]);
    connect_stdio(
        "future",
        &node(),
        &server_args(dir),
        &env,
        dir,
        UpstreamEvents::new(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e} ({})", e.stderr_tail()))
}

/// The server over HTTP, killed when dropped, and the hub's connection to it.
async fn over_http(dir: &Path) -> (tokio::process::Child, Upstream) {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut args = server_args(dir);
    args.extend(["http".to_owned(), port.to_string()]);
    let mut child = tokio::process::Command::new(node())
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(line.as_deref(), Some("listening"));
    let (url, headers) = http_support::resolved(&format!("http://127.0.0.1:{port}/mcp"), &[], &[]);
    let http = transport(&url, &headers, &HttpPolicy::default()).unwrap();
    let upstream = connect_transport("future", http.transport, UpstreamEvents::new())
        .await
        .expect("the hub connects over HTTP");
    (child, upstream)
}

/// pi's side: a bare streamable-HTTP client.
struct Pi {
    http: reqwest::Client,
    url: String,
    session: Option<String>,
}

impl Pi {
    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .post(&self.url)
            .bearer_auth(TOKEN)
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json")
            .body(body.to_string());
        if let Some(session) = &self.session {
            request = request.header("Mcp-Session-Id", session);
        }
        request
    }

    /// A request answered as plain JSON.
    async fn ask(&mut self, id: i64, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let response = self.post(&body).send().await.unwrap();
        assert_eq!(response.status(), 200);
        if let Some(s) = response.headers().get("mcp-session-id") {
            self.session = Some(s.to_str().unwrap().to_owned());
        }
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["id"], id, "{answer}");
        answer
    }
}

/// Takes the events of an event stream as they come.
struct Events {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: Vec<u8>,
}

impl Events {
    async fn next(&mut self) -> Value {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let text = String::from_utf8(event).unwrap();
                let data: Vec<&str> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                if data.is_empty() {
                    continue; // a comment
                }
                return serde_json::from_str(&data.join("\n")).unwrap();
            }
            let chunk = self.body.next().await.expect("the stream goes on").unwrap();
            self.buffer.extend_from_slice(&chunk);
        }
    }
}

/// Everything pi sees of the server through `hub`, against what the server wrote.
async fn pi_sees_what_the_server_wrote(hub: &Hub) {
    let f = fixtures();
    let mut pi = Pi {
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
        url: hub.url("future").unwrap(),
        session: None,
    };
    let initialize = json!({"protocolVersion": "2025-11-25", "capabilities": {"sampling": {}},
        "clientInfo": {"name": "pi", "version": "0"}});
    let initialized = pi.ask(1, "initialize", initialize).await;
    assert_eq!(initialized["result"], f["initialize"]);
    let accepted = pi
        .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);

    // The list as the server wrote it, less the withheld tool.
    let listed = pi.ask(2, "tools/list", json!({})).await;
    let mut expected = f["tools"].clone();
    expected["tools"]
        .as_array_mut()
        .unwrap()
        .retain(|t| t["name"] != "kept-back");
    assert_eq!(listed["result"], expected);

    // A call: the server's notifications and its request come first, on the call's stream.
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": "hi"}}});
    let response = pi.post(&call).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut events = Events {
        body: response.bytes_stream().boxed(),
        buffer: Vec::new(),
    };
    assert_eq!(events.next().await, f["notification"]);
    assert_eq!(events.next().await, f["custom"]);
    let asked = events.next().await;
    let hub_id = asked["id"].clone();
    assert!(hub_id.is_string(), "an id of the hub's: {asked}");
    let mut expected = f["request"].clone();
    expected["jsonrpc"] = json!("2.0");
    expected["id"] = hub_id.clone();
    assert_eq!(asked, expected);
    let answered = pi
        .post(&json!({"jsonrpc": "2.0", "id": hub_id, "result": sampled()}))
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 202);

    // The result as the server wrote it, with pi's answer as the server got it, and the hub's
    // answer to the server's ping (which pi never saw).
    let result = events.next().await;
    assert_eq!(result["id"], 3, "{result}");
    let mut expected = f["result"].clone();
    expected["sampled"] = sampled();
    expected["pinged"] = json!({});
    assert_eq!(result["result"], expected);

    // A request the server cancels: cancelled at pi, under the hub's id for it.
    let call = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "cancels", "arguments": {}}});
    let response = pi.post(&call).send().await.unwrap();
    let mut events = Events {
        body: response.bytes_stream().boxed(),
        buffer: Vec::new(),
    };
    let asked = events.next().await;
    assert_eq!(asked["method"], "elicitation/create");
    assert_eq!(asked["params"], f["elicit"]);
    let cancelled = events.next().await;
    assert_eq!(
        cancelled["method"], "notifications/cancelled",
        "{cancelled}"
    );
    assert_eq!(cancelled["params"]["requestId"], asked["id"]);
    let result = events.next().await;
    assert_eq!(result["id"], 4, "{result}");
    assert_eq!(result["result"]["content"][0]["text"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_of_a_newer_server_reaches_pi_over_stdio() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let upstream = over_stdio(dir.path()).await;
        let hub = serve(
            vec![(upstream, Withheld::new(["kept-back"]))],
            TOKEN.to_owned(),
        )
        .await
        .unwrap();
        pi_sees_what_the_server_wrote(&hub).await;
        hub.shutdown().await;
    })
    .await
    .expect("the test finishes in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_of_a_newer_server_reaches_pi_over_http() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let (_server, upstream) = over_http(dir.path()).await;
        let hub = serve(
            vec![(upstream, Withheld::new(["kept-back"]))],
            TOKEN.to_owned(),
        )
        .await
        .unwrap();
        pi_sees_what_the_server_wrote(&hub).await;
        hub.shutdown().await;
    })
    .await
    .expect("the test finishes in time");
}
