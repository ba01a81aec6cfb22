//! The hub relays a real server (server-everything over stdio) to a real MCP client over
//! streamable HTTP: what passes through unchanged, what it refuses, and what it kills.

// Test code fails loudly on purpose; the workspace denies unwrap only in product code.
#![allow(clippy::unwrap_used, clippy::expect_used, deprecated)]

mod http_support;
mod relay_support;

use std::time::Duration;

use hub::relay::{UpstreamEvents, Withheld};
use relay_support::*;
use rmcp::ServiceError;
use rmcp::model::{
    ArgumentInfo, CallToolRequest, CallToolRequestParams, CallToolResult, ClientCapabilities,
    ClientRequest, CompleteRequestParams, ErrorCode, GetPromptRequestParams, JsonObject,
    LoggingLevel, PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams, Reference,
    ServerResult, SetLevelRequestParams, SubscribeRequestParams,
};
use rmcp::service::PeerRequestOptions;
use serde_json::json;

const TOKEN: &str = "hub-test-token-0123456789";

fn args(value: serde_json::Value) -> JsonObject {
    value.as_object().cloned().unwrap()
}

fn call(name: &str, arguments: serde_json::Value) -> CallToolRequestParams {
    CallToolRequestParams::new(name.to_owned()).with_arguments(args(arguments))
}

fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The JSON-RPC error a relayed call ended with.
fn rpc_error(e: ServiceError) -> rmcp::ErrorData {
    match e {
        ServiceError::McpError(e) => e,
        other => panic!("expected a JSON-RPC error, got {other}"),
    }
}

async fn bounded<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("the test finishes in time");
}

async fn hub_for(upstream: hub::connect::Upstream, withheld: Withheld) -> BothWays {
    let hub = serve_both_ways(vec![(upstream, withheld)], TOKEN).await;
    assert!(hub.addr().unwrap().ip().is_loopback());
    hub
}

/// A test run both ways: over HTTP and through the relay pi starts.
macro_rules! both_ways {
    ($name:ident) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn over_http() {
                super::$name(Via::Http).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn through_the_relay() {
                super::$name(Via::Relay).await;
            }
        }
    };
}

both_ways!(the_hub_passes_tools_resources_prompts_completion_and_logging_through);
both_ways!(progress_reaches_the_client_under_its_own_token);
both_ways!(withheld_and_unlisted_tools_are_refused_before_the_server);
both_ways!(the_servers_requests_reach_the_client_and_fail_cleanly_without_one);
both_ways!(a_cancelled_call_is_cancelled_upstream);

async fn the_hub_passes_tools_resources_prompts_completion_and_logging_through(via: Via) {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let upstream = start_everything("everything", UpstreamEvents::new(), dir.path()).await;
        let listed = listed_tools(&upstream);
        let info = server_info(&upstream);
        let direct = direct(&upstream);
        assert_eq!(info.protocol_version, ProtocolVersion::V_2025_11_25);
        assert!(listed.iter().any(|t| t.name == "echo"));

        let hub = hub_for(upstream, Withheld::none()).await;
        let url = hub.url("everything").unwrap();
        assert!(url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp/everything"));
        let (client, mut seen) = connect_via(
            &hub,
            via,
            "everything",
            TOKEN,
            ClientCapabilities::default(),
        )
        .await;

        // initialize: the server's own answer, as received at connect.
        let answer = client.peer_info().unwrap();
        assert_eq!(answer.protocol_version, ProtocolVersion::V_2025_11_25);
        assert_eq!(answer.server_info.as_ref(), Some(&info.server_info));
        assert_eq!(
            answer.server_info.as_ref().unwrap().name,
            "mcp-servers/everything"
        );
        assert_eq!(answer.capabilities, info.capabilities);
        assert_eq!(answer.instructions, info.instructions);
        assert!(
            answer
                .instructions
                .as_deref()
                .unwrap_or("")
                .contains("Everything")
        );

        // tools/list: exactly the server's list.
        assert_eq!(client.list_all_tools().await.unwrap(), listed);

        // tools/call: the same result as calling the server directly.
        let relayed = client
            .call_tool(call("echo", json!({"message": "hi there"})))
            .await
            .unwrap();
        let straight = direct
            .call_tool(call("echo", json!({"message": "hi there"})))
            .await
            .unwrap();
        assert_eq!(relayed, straight);
        assert_eq!(text_of(&relayed), "Echo: hi there");

        // resources: list, templates, read.
        let resources = client.list_all_resources().await.unwrap();
        assert_eq!(resources, direct.list_all_resources().await.unwrap());
        assert!(!resources.is_empty());
        let uri = resources[0].uri.clone();
        let read = client
            .read_resource(ReadResourceRequestParams::new(uri.clone()))
            .await
            .unwrap();
        assert_eq!(
            read,
            direct
                .read_resource(ReadResourceRequestParams::new(uri.clone()))
                .await
                .unwrap()
        );
        assert!(!read.contents.is_empty());
        let templates = client.list_all_resource_templates().await.unwrap();
        assert_eq!(
            templates,
            direct.list_all_resource_templates().await.unwrap()
        );
        assert!(!templates.is_empty());

        // prompts: list and get.
        let prompts = client.list_all_prompts().await.unwrap();
        assert_eq!(prompts, direct.list_all_prompts().await.unwrap());
        assert!(prompts.iter().any(|p| p.name == "simple-prompt"));
        let prompt = client
            .get_prompt(GetPromptRequestParams::new("simple-prompt"))
            .await
            .unwrap();
        assert_eq!(
            prompt,
            direct
                .get_prompt(GetPromptRequestParams::new("simple-prompt"))
                .await
                .unwrap()
        );

        // completion/complete.
        let ask = || {
            CompleteRequestParams::new(
                Reference::for_prompt("completable-prompt"),
                ArgumentInfo::new("department", "Eng"),
            )
        };
        let completed = client.complete(ask()).await.unwrap();
        assert_eq!(completed.completion.values, ["Engineering"]);
        assert_eq!(completed, direct.complete(ask()).await.unwrap());

        // logging/setLevel, then a logging message the server sends on a subscription.
        client
            .set_level(SetLevelRequestParams::new(LoggingLevel::Debug))
            .await
            .unwrap();
        client
            .subscribe(SubscribeRequestParams::new(uri.clone()))
            .await
            .unwrap();
        let logged = wait_for(&mut seen, Duration::from_secs(10), |s| match s {
            Seen::Log(log) => Some(log.data.to_string()),
            _ => None,
        })
        .await
        .expect("the server's logging message reaches the client");
        assert!(logged.contains("Subscribe"), "{logged}");

        // notifications/resources/updated, for the subscribed resource.
        let toggled = client
            .call_tool(call("toggle-subscriber-updates", json!({})))
            .await
            .unwrap();
        assert_ne!(toggled.is_error, Some(true), "{}", text_of(&toggled));
        let updated = wait_for(&mut seen, Duration::from_secs(10), |s| match s {
            Seen::ResourceUpdated(u) => Some(u.clone()),
            _ => None,
        })
        .await
        .expect("the resource update reaches the client");
        assert_eq!(updated, uri);

        // notifications/resources/list_changed: the server adds a resource of its own.
        let data = "data:text/plain;base64,aGVsbG8gcmVsYXk=";
        let gzipped = client
            .call_tool(call(
                "gzip-file-as-resource",
                json!({"name": "relay.txt.gz", "data": data}),
            ))
            .await
            .unwrap();
        assert_ne!(gzipped.is_error, Some(true), "{}", text_of(&gzipped));
        wait_for(&mut seen, Duration::from_secs(10), |s| {
            (*s == Seen::ResourceListChanged).then_some(())
        })
        .await
        .expect("the resource list change reaches the client");

        // Every call counted, by tool: never its arguments.
        let calls = hub.tool_calls();
        let echo = calls.iter().find(|c| c.tool == "echo").unwrap();
        assert_eq!(
            (
                echo.server.as_str(),
                echo.calls,
                echo.ok,
                echo.error,
                echo.refused
            ),
            ("everything", 1, 1, 0, 0)
        );
        assert!(echo.result_bytes > "Echo: hi there".len() as u64);
        assert_eq!(calls.iter().map(|c| c.calls).sum::<u64>(), 3);
        let counted = serde_json::to_string(&calls).unwrap();
        assert!(
            !counted.contains("hi there") && !counted.contains("aGVsbG8"),
            "{counted}"
        );
        assert!(counted.contains("\"resultBytes\""), "{counted}");

        drop(client);
        hub.shutdown().await;
    })
    .await;
}

async fn progress_reaches_the_client_under_its_own_token(via: Via) {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let upstream = start_everything("everything", UpstreamEvents::new(), dir.path()).await;
        let hub = hub_for(upstream, Withheld::none()).await;
        let (client, mut seen) = connect_via(
            &hub,
            via,
            "everything",
            TOKEN,
            ClientCapabilities::default(),
        )
        .await;

        let request = ClientRequest::CallToolRequest(CallToolRequest::new(call(
            "trigger-long-running-operation",
            json!({"duration": 1, "steps": 4}),
        )));
        let handle = client
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
            .unwrap();
        let token = handle.progress_token.clone();
        let ServerResult::CallToolResult(result) = handle.await_response().await.unwrap() else {
            panic!("a tool result")
        };
        assert!(text_of(&result).contains("Long running operation completed"));

        let mut steps = Vec::new();
        while steps.len() < 4 {
            let progress = wait_for(&mut seen, Duration::from_secs(5), |s| match s {
                Seen::Progress(p) => Some(p.clone()),
                _ => None,
            })
            .await
            .unwrap_or_else(|| panic!("4 progress notifications, got {steps:?}"));
            assert_eq!(progress.progress_token, token, "pi's own token");
            assert_eq!(progress.total, Some(4.0));
            steps.push(progress.progress as u32);
        }
        steps.sort_unstable();
        assert_eq!(steps, [1, 2, 3, 4]);

        drop(client);
        hub.shutdown().await;
    })
    .await;
}

async fn withheld_and_unlisted_tools_are_refused_before_the_server(via: Via) {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let upstream = start_everything("everything", UpstreamEvents::new(), dir.path()).await;
        let listed = listed_tools(&upstream);
        let direct = direct(&upstream);
        let withheld = Withheld(vec![
            "echo".to_owned(),
            "toggle-subscriber-updates".to_owned(),
        ]);
        let hub = hub_for(upstream, withheld.clone()).await;
        let (client, mut seen) = connect_via(
            &hub,
            via,
            "everything",
            TOKEN,
            ClientCapabilities::default(),
        )
        .await;

        // Left out of the list, everything else in it.
        let relayed = client.list_all_tools().await.unwrap();
        let expected: Vec<_> = listed
            .iter()
            .filter(|t| !withheld.contains(&t.name))
            .cloned()
            .collect();
        assert_eq!(relayed, expected);
        assert_eq!(relayed.len() + 2, listed.len());

        // Subscribed, a call that reached the server would have it send an update at once.
        let uri = client.list_all_resources().await.unwrap()[0].uri.clone();
        client
            .subscribe(SubscribeRequestParams::new(uri.clone()))
            .await
            .unwrap();
        let refused = rpc_error(
            client
                .call_tool(call("toggle-subscriber-updates", json!({})))
                .await
                .unwrap_err(),
        );
        assert_eq!(refused.code, ErrorCode::INVALID_PARAMS);
        assert!(refused.message.contains("withheld"), "{}", refused.message);
        let refused = rpc_error(
            client
                .call_tool(call("echo", json!({"message": "x"})))
                .await
                .unwrap_err(),
        );
        assert!(refused.message.contains("withheld"), "{}", refused.message);
        let unlisted = rpc_error(
            client
                .call_tool(call("no-such-tool", json!({})))
                .await
                .unwrap_err(),
        );
        assert_eq!(unlisted.code, ErrorCode::INVALID_PARAMS);
        assert!(
            unlisted.message.contains("did not list"),
            "{}",
            unlisted.message
        );
        let after = drain(&mut seen, Duration::from_millis(1500)).await;
        assert!(
            !after.iter().any(|s| matches!(s, Seen::ResourceUpdated(_))),
            "the refused call reached the server: {after:?}"
        );

        // The control: the same call made straight to the server does send the update.
        let toggled = direct
            .call_tool(call("toggle-subscriber-updates", json!({})))
            .await
            .unwrap();
        assert_ne!(toggled.is_error, Some(true));
        let updated = wait_for(&mut seen, Duration::from_secs(10), |s| match s {
            Seen::ResourceUpdated(u) => Some(u.clone()),
            _ => None,
        })
        .await;
        assert_eq!(updated.as_deref(), Some(uri.as_str()));

        let calls = hub.tool_calls();
        // A name the server did not list is counted with the others, never under its own name.
        assert!(!calls.iter().any(|c| c.tool == "no-such-tool"), "{calls:?}");
        for tool in [
            "echo",
            "toggle-subscriber-updates",
            protocol::usage::OTHER_TOOL,
        ] {
            let c = calls.iter().find(|c| c.tool == tool).unwrap();
            assert_eq!(
                (c.calls, c.refused, c.ok, c.error, c.result_bytes),
                (1, 1, 0, 0, 0),
                "{tool}"
            );
        }

        drop(client);
        hub.shutdown().await;
    })
    .await;
}

async fn the_servers_requests_reach_the_client_and_fail_cleanly_without_one(via: Via) {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let events = UpstreamEvents::with_capabilities(
            serde_json::to_value(
                ClientCapabilities::builder()
                    .enable_roots()
                    .enable_sampling()
                    .build(),
            )
            .unwrap(),
        );
        let upstream = start_everything("everything", events, dir.path()).await;
        let direct = direct(&upstream);
        assert!(
            upstream
                .tools
                .iter()
                .any(|t| t.name == "trigger-sampling-request")
        );
        assert!(!upstream.events().has_downstream());

        // No client attached yet: the server's sampling request gets a clean JSON-RPC error.
        let alone = direct
            .call_tool(call(
                "trigger-sampling-request",
                json!({"prompt": "anyone?"}),
            ))
            .await
            .unwrap();
        assert_eq!(alone.is_error, Some(true));
        assert!(
            text_of(&alone).contains("no MCP client is attached"),
            "{}",
            text_of(&alone)
        );

        let hub = hub_for(upstream, Withheld::none()).await;
        let capabilities = ClientCapabilities::builder()
            .enable_roots()
            .enable_sampling()
            .build();
        let (client, mut seen) = connect_via(&hub, via, "everything", TOKEN, capabilities).await;
        assert!(hub.upstreams()[0].events().has_downstream());

        // sampling/createMessage: relayed to the client, its answer back to the server.
        let sampled = client
            .call_tool(call(
                "trigger-sampling-request",
                json!({"prompt": "ping", "maxTokens": 20}),
            ))
            .await
            .unwrap();
        assert!(
            text_of(&sampled).contains(SAMPLED_TEXT),
            "{}",
            text_of(&sampled)
        );
        let asked = wait_for(&mut seen, Duration::from_secs(5), |s| match s {
            Seen::Sampled(m) => Some(m.clone()),
            _ => None,
        })
        .await
        .unwrap();
        assert!(asked.contains("ping"), "{asked}");

        // roots/list: the same.
        let roots = client
            .call_tool(call("get-roots-list", json!({})))
            .await
            .unwrap();
        assert!(text_of(&roots).contains(ROOT_URI), "{}", text_of(&roots));

        // notifications/roots/list_changed from the client reaches the server, which lists again.
        let _ = drain(&mut seen, Duration::from_millis(200)).await;
        client.notify_roots_list_changed().await.unwrap();
        wait_for(&mut seen, Duration::from_secs(10), |s| {
            (*s == Seen::RootsListed).then_some(())
        })
        .await
        .expect("the server asks for the roots again");

        drop(client);
        hub.shutdown().await;
    })
    .await;
}

async fn a_cancelled_call_is_cancelled_upstream(via: Via) {
    bounded(async {
        // Two hubs in a row: the first one's server is the second hub, over HTTP, so what reaches
        // the second one is what the first one sent upstream.
        let dir = tempfile::tempdir().unwrap();
        let upstream = start_everything("everything", UpstreamEvents::new(), dir.path()).await;
        let inner = hub_for(upstream, Withheld::none()).await;
        let (url, headers) = http_support::resolved(
            &inner.url("everything").unwrap(),
            &[("Authorization", "Bearer ${T}")],
            &[("T", TOKEN)],
        );
        let http = hub::http::transport(&url, &headers, &hub::http::HttpPolicy::default()).unwrap();
        let relayed =
            hub::connect::connect_transport("outer", http.transport, UpstreamEvents::new())
                .await
                .expect("the first hub connects to the second one");
        assert_eq!(relayed.process_group(), None);
        assert!(
            relayed
                .tools
                .iter()
                .any(|t| t.name == "trigger-long-running-operation")
        );
        let outer = hub_for(relayed, Withheld::none()).await;
        let (client, mut seen) =
            connect_via(&outer, via, "outer", TOKEN, ClientCapabilities::default()).await;

        let request = ClientRequest::CallToolRequest(CallToolRequest::new(call(
            "trigger-long-running-operation",
            json!({"duration": 30, "steps": 30}),
        )));
        let handle = client
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
            .unwrap();
        let token = handle.progress_token.clone();
        let first = wait_for(&mut seen, Duration::from_secs(10), |s| match s {
            Seen::Progress(p) => Some(p.clone()),
            _ => None,
        })
        .await
        .expect("progress through both hubs");
        assert_eq!(first.progress_token, token);
        handle
            .cancel(Some("the test cancels".to_owned()))
            .await
            .unwrap();

        // Both hubs see the call end well before the server's 30 seconds: the second one when its
        // upstream call is cancelled, the first one when it has handled pi's cancellation (each
        // counts on its own task, in no set order).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let ended = |calls: Vec<hub::relay::ToolCallCount>| {
            calls
                .iter()
                .any(|c| c.tool == "trigger-long-running-operation" && c.error == 1)
        };
        loop {
            if ended(inner.tool_calls()) && ended(outer.tool_calls()) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the cancellation did not reach upstream"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let outer_calls = outer.tool_calls();
        let c = outer_calls
            .iter()
            .find(|c| c.tool == "trigger-long-running-operation")
            .unwrap();
        assert_eq!((c.calls, c.error), (1, 1));

        // Both hubs still serve.
        let echoed = client
            .call_tool(call("echo", json!({"message": "still here"})))
            .await
            .unwrap();
        assert_eq!(text_of(&echoed), "Echo: still here");

        drop(client);
        outer.shutdown().await;
        inner.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_the_token_gets_401() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let upstream = start_everything("everything", UpstreamEvents::new(), dir.path()).await;
        let hub = hub_for(upstream, Withheld::none()).await;
        let url = hub.url("everything").unwrap();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let initialize = json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "curl-like", "version": "0"}}
        });
        let post = |url: &str, auth: Option<String>| {
            let mut request = http
                .post(url)
                .header("Accept", "application/json, text/event-stream")
                .json(&initialize);
            if let Some(auth) = auth {
                request = request.header("Authorization", auth);
            }
            request.send()
        };
        for auth in [
            None,
            Some("Bearer wrong".to_owned()),
            Some(format!("Bearer {TOKEN}x")),
            Some(format!("bearer {TOKEN}")),
            Some(TOKEN.to_owned()),
            Some(format!("Basic {TOKEN}")),
        ] {
            let status = post(&url, auth.clone()).await.unwrap().status();
            assert_eq!(status.as_u16(), 401, "{auth:?}");
        }
        // Other methods and paths too, before anything else is looked at.
        let get = http
            .get(&url)
            .header("Accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(get.status().as_u16(), 401);
        let delete = http.delete(&url).send().await.unwrap();
        assert_eq!(delete.status().as_u16(), 401);
        let elsewhere = post(&hub.url("nope").unwrap(), None).await.unwrap();
        assert_eq!(elsewhere.status().as_u16(), 401);
        let elsewhere = post(&hub.url("nope").unwrap(), Some(format!("Bearer {TOKEN}")))
            .await
            .unwrap();
        assert_eq!(elsewhere.status().as_u16(), 404);
        let right = post(&url, Some(format!("Bearer {TOKEN}"))).await.unwrap();
        assert_eq!(right.status().as_u16(), 200);

        // An rmcp client with a wrong token does not get in.
        let refused = tokio::time::timeout(
            Duration::from_secs(20),
            rmcp::ServiceExt::serve((), transport(&url, "not-the-token")),
        )
        .await
        .unwrap();
        assert!(refused.is_err());

        // A client asking for a newer protocol gets the one the server agreed with the hub.
        let newest = rmcp::ServiceExt::serve((), transport(&url, TOKEN))
            .await
            .unwrap();
        assert_eq!(
            newest.peer_info().unwrap().protocol_version,
            ProtocolVersion::V_2025_11_25
        );
        let page = newest
            .list_tools(Some(PaginatedRequestParams::default()))
            .await
            .unwrap();
        assert!(!page.tools.is_empty());

        drop(newest);
        hub.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_takes_only_the_token_and_a_served_name() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let upstream = start_everything("everything", UpstreamEvents::new(), dir.path()).await;
        let hub = hub_for(upstream, Withheld::none()).await;
        let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        // What the hub says to a first line, then to pi's initialize.
        let answers = |first: String| {
            let socket = hub.socket.clone();
            let initialize = initialize.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
                let (read, mut write) = stream.into_split();
                write.write_all(first.as_bytes()).await.unwrap();
                // The hub may have refused the first line already.
                let _ = write.write_all(format!("{initialize}\n").as_bytes()).await;
                let mut lines = tokio::io::BufReader::new(read).lines();
                let mut seen = Vec::new();
                while let Some(line) = lines.next_line().await.unwrap() {
                    seen.push(serde_json::from_str::<serde_json::Value>(&line).unwrap());
                    if seen.len() == 1 && seen[0].get("result").is_some() {
                        break;
                    }
                }
                seen
            }
        };
        for first in [
            "everything Bearer wrong\n".to_owned(),
            format!("everything Bearer {TOKEN}x\n"),
            format!("everything bearer {TOKEN}\n"),
            format!("everything {TOKEN}\n"),
            format!("nope Bearer {TOKEN}\n"),
            format!("Bearer {TOKEN}\n"),
            format!("{}\n", "x".repeat(5000)),
        ] {
            let seen = answers(first.clone()).await;
            assert_eq!(seen.len(), 1, "{first:.40}: {seen:?}");
            assert_eq!(
                seen[0]["error"]["message"],
                hub::pi_relay::REFUSED,
                "{first:.40}"
            );
            assert!(seen[0]["id"].is_null());
        }
        let seen = answers(hub::pi_relay::hello("everything", TOKEN)).await;
        assert_eq!(seen[0]["id"], 1);
        assert_eq!(
            seen[0]["result"]["serverInfo"]["name"],
            "mcp-servers/everything"
        );

        // The relay with a wrong token: the client gets no session, and the relay ends.
        let mut relay = start_relay(&hub.socket, "everything", "not-the-token");
        let mut stdin = relay.stdin.take().unwrap();
        // The hub may have refused already and closed pi's input.
        let _ = stdin.write_all(format!("{initialize}\n").as_bytes()).await;
        let mut out = tokio::io::BufReader::new(relay.stdout.take().unwrap()).lines();
        let refusal: serde_json::Value =
            serde_json::from_str(&out.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(refusal["error"]["message"], hub::pi_relay::REFUSED);
        assert_eq!(out.next_line().await.unwrap(), None);
        let status = relay.wait().await.unwrap();
        assert!(status.success(), "the relay ends with the hub's side");

        // Without the token in its environment, it does not start.
        let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_hub-job-relay"))
            .args(["job-relay", "--socket"])
            .arg(&hub.socket)
            .arg("everything")
            .env_clear()
            .stderr(std::process::Stdio::piped())
            .output()
            .await
            .unwrap();
        assert_eq!(status.status.code(), Some(1));
        assert!(
            String::from_utf8_lossy(&status.stderr).contains("PI_DISPATCH_HUB_TOKEN is not set")
        );
        hub.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_the_hub_down_kills_the_servers_whole_process_group() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let upstream =
            start_everything_with_a_sibling("everything", UpstreamEvents::new(), dir.path()).await;
        let group = upstream
            .process_group()
            .expect("a stdio server has a process group");
        let members = group_members(group);
        assert!(
            members.len() >= 2,
            "the server and its sibling: {members:?}"
        );
        assert!(members.contains(&group), "the server leads its group");
        assert!(
            upstream
                .stderr_tail()
                .contains("Starting default (STDIO) server")
        );

        let hub = hub_for(upstream, Withheld::none()).await;
        let (client, _seen) = connect_via(
            &hub,
            Via::Http,
            "everything",
            TOKEN,
            ClientCapabilities::default(),
        )
        .await;
        let echoed = client
            .call_tool(call("echo", json!({"message": "bye"})))
            .await
            .unwrap();
        assert_eq!(text_of(&echoed), "Echo: bye");

        let stopping = std::time::Instant::now();
        hub.shutdown().await;
        let took = stopping.elapsed();
        assert!(took < Duration::from_secs(10), "shutdown took {took:?}");
        let left = wait_group_gone(group, Duration::from_secs(10)).await;
        assert!(left.is_empty(), "still running in the group: {left:?}");
        assert!(members.iter().all(|pid| !running(*pid)));

        // The client finds the hub gone.
        let after = tokio::time::timeout(
            Duration::from_secs(20),
            client.call_tool(call("echo", json!({"message": "anyone?"}))),
        )
        .await
        .expect("the client gives up");
        assert!(after.is_err());
    })
    .await;
}
