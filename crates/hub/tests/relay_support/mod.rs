//! What the relay's tests share: the real servers installed under `node_modules` (missing ones fail
//! the tests), a real rmcp client for the hub, and process-group probing through `/proc`.

// Sampling, roots and logging are deprecated in rmcp (SEP-2577) but are what 2025-11-25 servers use.
#![allow(
    dead_code,
    unused_imports,
    clippy::unwrap_used,
    clippy::expect_used,
    deprecated
)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use hub::connect::{Upstream, connect_stdio};
use hub::relay::UpstreamEvents;
use hub::rpc::{Peer, RpcError};
use hub::stdio::environment;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, CompleteRequestParams,
    CompleteResult, CreateMessageRequestParams, CreateMessageResult, GetPromptRequestParams,
    GetPromptResult, Implementation, InitializeResult, ListRootsResult,
    LoggingMessageNotificationParam, ProgressNotificationParam, Prompt, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResult, Resource, ResourceTemplate,
    ResourceUpdatedNotificationParam, Root, SamplingMessage, Tool,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// Every test gives up after this long.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(90);

pub use testkit::{node, node_modules};

/// server-everything's entry file, from its package.json `bin`; the tests fail without it.
pub fn everything() -> PathBuf {
    let package = node_modules().join("@modelcontextprotocol/server-everything");
    let manifest = std::fs::read_to_string(package.join("package.json")).unwrap_or_else(|e| {
        panic!(
            "{} is missing ({e}): install the project's node_modules (npm install)",
            package.display()
        )
    });
    let manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    let bin = manifest["bin"]["mcp-server-everything"]
        .as_str()
        .expect("server-everything names its bin");
    let entry = package.join(bin);
    assert!(entry.is_file(), "{} is missing", entry.display());
    entry
}

/// The runner's environment in these tests: PATH and HOME, plus names a server must never see.
pub fn runner_env(home: &Path) -> Vec<(String, String)> {
    [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", home.to_str().unwrap()),
        ("OPENAI_API_KEY", "cnry-provider-key"),
        ("GH_TOKEN", "cnry-forge-token"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// server-everything over stdio, started the way the runner starts a stdio server.
pub async fn start_everything(name: &str, events: UpstreamEvents, dir: &Path) -> Upstream {
    let args = vec![
        everything().to_str().unwrap().to_owned(),
        "stdio".to_owned(),
    ];
    start(name, &node(), &args, events, dir).await
}

/// server-everything behind `sh`, which leaves a `sleep` running in the server's process group.
pub async fn start_everything_with_a_sibling(
    name: &str,
    events: UpstreamEvents,
    dir: &Path,
) -> Upstream {
    let args = vec![
        "-c".to_owned(),
        r#"sleep 300 & exec "$0" "$@""#.to_owned(),
        node().to_str().unwrap().to_owned(),
        everything().to_str().unwrap().to_owned(),
        "stdio".to_owned(),
    ];
    start(name, Path::new("/bin/sh"), &args, events, dir).await
}

pub async fn start(
    name: &str,
    command: &Path,
    args: &[String],
    events: UpstreamEvents,
    dir: &Path,
) -> Upstream {
    let env = environment(&runner_env(dir), &[]);
    tokio::time::timeout(
        Duration::from_secs(60),
        connect_stdio(name, command, args, &env, dir, events),
    )
    .await
    .expect("the server answers within a minute")
    .unwrap_or_else(|e| panic!("{name} did not connect: {e} ({})", e.stderr_tail()))
}

/// The tools the server listed at connect, read as rmcp reads them.
pub fn listed_tools(upstream: &Upstream) -> Vec<Tool> {
    upstream
        .tools
        .iter()
        .map(|t| serde_json::from_value(t.to_value()).unwrap())
        .collect()
}

/// The server's `initialize` answer at connect, read as rmcp reads it.
pub fn server_info(upstream: &Upstream) -> InitializeResult {
    serde_json::from_value(upstream.info().clone()).unwrap()
}

/// The server reached directly, on the hub's own upstream client (no hub in between), its answers
/// read as rmcp reads them.
#[derive(Clone)]
pub struct Direct(pub Peer);

pub fn direct(upstream: &Upstream) -> Direct {
    Direct(upstream.peer.clone())
}

impl Direct {
    async fn ask<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: P,
    ) -> Result<R, RpcError> {
        let result = self
            .0
            .request(method, serde_json::to_value(params).unwrap())
            .await?;
        Ok(serde_json::from_value(result).unwrap())
    }

    /// Every page of a list.
    async fn all<R: DeserializeOwned>(&self, method: &str, key: &str) -> Vec<R> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let page: Value = self.ask(method, params).await.unwrap();
            all.extend(serde_json::from_value::<Vec<R>>(page[key].clone()).unwrap());
            match page["nextCursor"].as_str() {
                Some(next) if !next.is_empty() => cursor = Some(next.to_owned()),
                _ => return all,
            }
        }
    }

    pub async fn call_tool(
        &self,
        params: CallToolRequestParams,
    ) -> Result<CallToolResult, RpcError> {
        self.ask("tools/call", params).await
    }

    pub async fn read_resource(
        &self,
        params: ReadResourceRequestParams,
    ) -> Result<ReadResourceResult, RpcError> {
        self.ask("resources/read", params).await
    }

    pub async fn get_prompt(
        &self,
        params: GetPromptRequestParams,
    ) -> Result<GetPromptResult, RpcError> {
        self.ask("prompts/get", params).await
    }

    pub async fn complete(
        &self,
        params: CompleteRequestParams,
    ) -> Result<CompleteResult, RpcError> {
        self.ask("completion/complete", params).await
    }

    pub async fn list_all_resources(&self) -> Result<Vec<Resource>, RpcError> {
        Ok(self.all("resources/list", "resources").await)
    }

    pub async fn list_all_resource_templates(&self) -> Result<Vec<ResourceTemplate>, RpcError> {
        Ok(self
            .all("resources/templates/list", "resourceTemplates")
            .await)
    }

    pub async fn list_all_prompts(&self) -> Result<Vec<Prompt>, RpcError> {
        Ok(self.all("prompts/list", "prompts").await)
    }
}

/// What the test client saw, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    Progress(ProgressNotificationParam),
    Log(LoggingMessageNotificationParam),
    ResourceUpdated(String),
    ResourceListChanged,
    ToolListChanged,
    PromptListChanged,
    Sampled(String),
    RootsListed,
}

/// A real rmcp client standing in for pi: it records what the server sends it, answers sampling with
/// a fixed text and roots with one root.
#[derive(Clone)]
pub struct TestClient {
    seen: mpsc::UnboundedSender<Seen>,
    capabilities: ClientCapabilities,
    protocol: ProtocolVersion,
}

pub const SAMPLED_TEXT: &str = "pong from the test client";
pub const ROOT_URI: &str = "file:///workspace";

impl ClientHandler for TestClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            self.capabilities.clone(),
            Implementation::new("relay-test-client", "0"),
        )
        .with_protocol_version(self.protocol.clone())
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        let _ = self.seen.send(Seen::Progress(params));
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        let _ = self.seen.send(Seen::Log(params));
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        let _ = self.seen.send(Seen::ResourceUpdated(params.uri));
    }

    async fn on_resource_list_changed(&self, _: NotificationContext<RoleClient>) {
        let _ = self.seen.send(Seen::ResourceListChanged);
    }

    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        let _ = self.seen.send(Seen::ToolListChanged);
    }

    async fn on_prompt_list_changed(&self, _: NotificationContext<RoleClient>) {
        let _ = self.seen.send(Seen::PromptListChanged);
    }

    #[allow(deprecated)]
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let asked = serde_json::to_string(&params.messages).unwrap_or_default();
        let _ = self.seen.send(Seen::Sampled(asked));
        Ok(CreateMessageResult::new(
            SamplingMessage::assistant_text(SAMPLED_TEXT),
            "test-model".to_owned(),
        ))
    }

    #[allow(deprecated)]
    async fn list_roots(
        &self,
        _: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        let _ = self.seen.send(Seen::RootsListed);
        let mut root = Root::new(ROOT_URI);
        root.name = Some("workspace".to_owned());
        Ok(ListRootsResult::new(vec![root]))
    }
}

pub type Client = RunningService<RoleClient, TestClient>;

/// A client for the hub's `url`, speaking only to 127.0.0.1 (no proxy), with `token` as bearer.
pub fn transport(url: &str, token: &str) -> StreamableHttpClientTransport<reqwest::Client> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a plain HTTP client");
    StreamableHttpClientTransport::with_client(
        http,
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
    )
}

pub async fn connect_client(
    url: &str,
    token: &str,
    capabilities: ClientCapabilities,
) -> (Client, mpsc::UnboundedReceiver<Seen>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let handler = TestClient {
        seen: tx,
        capabilities,
        protocol: ProtocolVersion::V_2025_11_25,
    };
    let client = tokio::time::timeout(
        Duration::from_secs(30),
        handler.serve(transport(url, token)),
    )
    .await
    .expect("the hub answers")
    .expect("the client connects to the hub");
    (client, rx)
}

/// How a test's client reaches the hub: over loopback HTTP, or through the relay pi starts
/// (`hub-job-relay`, which is `pi-dispatch job-relay`) and the hub's socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Http,
    Relay,
}

/// A hub listening both ways, with its socket in a folder of its own.
pub struct BothWays {
    pub hub: hub::relay::Hub,
    pub socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for BothWays {
    type Target = hub::relay::Hub;
    fn deref(&self) -> &hub::relay::Hub {
        &self.hub
    }
}

impl BothWays {
    pub async fn shutdown(self) {
        self.hub.shutdown().await;
    }
}

/// Serves `upstreams` on loopback and on a unix socket.
pub async fn serve_both_ways(
    upstreams: Vec<(Upstream, hub::relay::Withheld)>,
    token: &str,
) -> BothWays {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("hub.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let listeners = hub::relay::Listeners {
        loopback: true,
        socket: Some(listener),
    };
    let hub = hub::relay::serve_on(upstreams, token.to_owned(), listeners)
        .await
        .expect("the hub starts");
    BothWays {
        hub,
        socket,
        _dir: dir,
    }
}

/// The relay pi would start for server `name`, with `token` in its environment: its standard
/// input and output piped, ended with its input.
pub fn start_relay(socket: &Path, name: &str, token: &str) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_hub-job-relay"))
        .arg("job-relay")
        .args(&hub::pi_config::relay_args(socket, name)[1..])
        .env_clear()
        .env(hub::pi_config::HUB_TOKEN_VARIABLE, token)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the relay starts")
}

/// A client of server `name` on `hub`, reaching it `via`.
pub async fn connect_via(
    hub: &BothWays,
    via: Via,
    name: &str,
    token: &str,
    capabilities: ClientCapabilities,
) -> (Client, mpsc::UnboundedReceiver<Seen>) {
    match via {
        Via::Http => connect_client(&hub.url(name).unwrap(), token, capabilities).await,
        Via::Relay => {
            let mut relay = start_relay(&hub.socket, name, token);
            let stdin = relay.stdin.take().unwrap();
            let stdout = relay.stdout.take().unwrap();
            // The relay ends when the client closes its input.
            tokio::spawn(async move {
                let _ = relay.wait().await;
            });
            let (tx, rx) = mpsc::unbounded_channel();
            let handler = TestClient {
                seen: tx,
                capabilities,
                protocol: ProtocolVersion::V_2025_11_25,
            };
            let client =
                tokio::time::timeout(Duration::from_secs(30), handler.serve((stdout, stdin)))
                    .await
                    .expect("the hub answers")
                    .expect("the client connects to the hub through the relay");
            (client, rx)
        }
    }
}

/// Waits (up to `within`) for something the client sees that `wanted` picks; what comes before is
/// dropped.
pub async fn wait_for<T>(
    seen: &mut mpsc::UnboundedReceiver<Seen>,
    within: Duration,
    mut wanted: impl FnMut(&Seen) -> Option<T>,
) -> Option<T> {
    tokio::time::timeout(within, async {
        while let Some(s) = seen.recv().await {
            if let Some(t) = wanted(&s) {
                return Some(t);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

/// Everything the client saw in the next `within`.
pub async fn drain(seen: &mut mpsc::UnboundedReceiver<Seen>, within: Duration) -> Vec<Seen> {
    let mut all = Vec::new();
    let _ = tokio::time::timeout(within, async {
        while let Some(s) = seen.recv().await {
            all.push(s);
        }
    })
    .await;
    all
}

/// The pids in process group `pgid` that are still running (a zombie has stopped running).
pub fn group_members(pgid: i32) -> Vec<i32> {
    let mut members = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return members;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp …: comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|at| &stat[at + 1..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[2] == pgid.to_string() {
            members.push(pid);
        }
    }
    members
}

/// Whether `pid` is still running (`/proc/<pid>` present and not a zombie).
pub fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rfind(')')
                .map(|at| stat[at + 1..].split_whitespace().next() != Some("Z"))
        })
        .unwrap_or(false)
}

/// Waits (up to `within`) until nothing in group `pgid` runs; returns what still does.
pub async fn wait_group_gone(pgid: i32, within: Duration) -> Vec<i32> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let members = group_members(pgid);
        if members.is_empty() || tokio::time::Instant::now() >= deadline {
            return members;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
