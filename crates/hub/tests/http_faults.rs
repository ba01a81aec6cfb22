//! The HTTP upstream against a hand-written server on 127.0.0.1 that misbehaves on purpose: each
//! failure is sorted into the spec's classes, a redirect is never followed, a 401 ends the job even
//! after connecting, a 1 GiB body is cut off near 16 MiB without the test process growing, the
//! headers go on every request and nothing else of the job's does, and the proxy used is the one
//! given, never the environment's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod http_support;

use std::time::Duration;

use http_support::{FaultServer, GIB, connect, error_of, memory, resolved};
use hub::connect::classify;
use hub::http::{Failure, HttpError, HttpPolicy, HttpServer, MAX_BODY, transport};
use serde_json::json;

const TOKEN: &str = "tok-5b1d";
const KEY: &str = "key-9c2e";
/// No test here waits on a server longer than this.
const BOUND: Duration = Duration::from_secs(20);

fn upstream(base: &str, kind: &str, policy: &HttpPolicy) -> HttpServer {
    let (url, headers) = resolved(
        &format!("{base}/mcp/{kind}"),
        &[("Authorization", "Bearer ${T}"), ("X-Api-Key", "${K}")],
        &[("T", TOKEN), ("K", KEY)],
    );
    transport(&url, &headers, policy).expect("the transport builds")
}

/// Connects to `kind` on `server` and returns how the monitor classifies the failure. The error
/// alone says the same, unless it only says the connection closed (the monitor recorded why).
async fn refused(server: &FaultServer, kind: &str) -> Failure {
    let up = upstream(&server.base(), kind, &HttpPolicy::default());
    let monitor = up.monitor.clone();
    let error = error_of(kind, BOUND, connect(up.transport)).await;
    let by_monitor = monitor.classify(&error);
    let alone = classify(&error);
    let closed = Failure::Fatal("the connection to the server closed before it answered".into());
    assert!(
        alone == by_monitor || alone == closed,
        "{kind}: {alone:?} / {by_monitor:?}"
    );
    by_monitor
}

/// `kind` on `server`, connected as the runner connects it.
async fn connected(server: &FaultServer, kind: &str) -> hub::connect::Upstream {
    let up = upstream(&server.base(), kind, &HttpPolicy::default());
    tokio::time::timeout(BOUND, connect(up.transport))
        .await
        .unwrap()
        .unwrap()
}

/// A call of the server's `echo`.
async fn echo(
    client: &hub::connect::Upstream,
    message: &str,
) -> Result<serde_json::Value, hub::rpc::RpcError> {
    client
        .peer
        .request(
            "tools/call",
            json!({"name": "echo", "arguments": {"message": message}}),
        )
        .await
}

fn fatal_with(failure: &Failure, words: &[&str]) -> bool {
    matches!(failure, Failure::Fatal(m) if words.iter().all(|w| m.contains(w)))
}

#[tokio::test]
async fn each_http_error_is_classified_as_the_spec_says() {
    let server = FaultServer::start().await;

    let redirect = refused(&server, "redirect").await;
    assert!(fatal_with(&redirect, &["302", "redirect"]), "{redirect:?}");
    assert!(
        server.seen().iter().all(|s| s.kind != "followed"),
        "the redirect was followed"
    );

    assert_eq!(
        refused(&server, "unauthorized").await,
        Failure::Unauthorized
    );

    for (kind, code) in [
        ("status-403", "403"),
        ("status-404", "404"),
        ("status-400", "400"),
        ("status-501", "501"),
    ] {
        let f = refused(&server, kind).await;
        assert!(fatal_with(&f, &[code]), "{kind}: {f:?}");
    }
    for (kind, code) in [
        ("status-500", "500"),
        ("status-502", "502"),
        ("status-503", "503"),
        ("status-408", "408"),
        ("status-429", "429"),
    ] {
        let f = refused(&server, kind).await;
        assert!(
            matches!(&f, Failure::Retryable(m) if m.contains(code)),
            "{kind}: {f:?}"
        );
    }

    let html = refused(&server, "not-json").await;
    assert!(fatal_with(&html, &["neither JSON"]), "{html:?}");
}

#[tokio::test]
async fn a_401_ends_the_job_and_the_monitor_says_so() {
    let server = FaultServer::start().await;
    let up = upstream(&server.base(), "unauthorized", &HttpPolicy::default());
    let monitor = up.monitor.clone();
    assert!(!monitor.is_unauthorized());
    let error = error_of("a 401", BOUND, connect(up.transport)).await;
    assert_eq!(monitor.classify(&error), Failure::Unauthorized);
    assert!(monitor.is_unauthorized());
    tokio::time::timeout(Duration::from_secs(1), monitor.unauthorized())
        .await
        .expect("the monitor's signal is already set");
}

#[tokio::test]
async fn a_401_after_connecting_ends_the_job() {
    let server = FaultServer::start().await;
    let up = upstream(&server.base(), "revoke", &HttpPolicy::default());
    let monitor = up.monitor.clone();
    let client = connect(up.transport).await.expect("initialize is answered");
    assert!(!monitor.is_unauthorized());
    let watcher = tokio::spawn({
        let monitor = monitor.clone();
        async move { monitor.unauthorized().await }
    });
    let call = client
        .peer
        .request("tools/call", json!({"name": "echo", "arguments": {}}));
    let error = tokio::time::timeout(BOUND, call)
        .await
        .expect("bounded")
        .expect_err("tools/call is answered 401");
    assert_eq!(classify(&error), Failure::Unauthorized, "{error}");
    assert_eq!(monitor.classify(&error), Failure::Unauthorized);
    tokio::time::timeout(Duration::from_secs(2), watcher)
        .await
        .expect("the runner's watch wakes on the 401")
        .unwrap();
    client.shutdown().await;
}

#[tokio::test]
async fn a_server_still_starting_is_retried_until_it_answers() {
    let server = FaultServer::start().await;
    let mut attempts = 0;
    let (client, monitor) = loop {
        attempts += 1;
        assert!(attempts <= 5, "still not connected after 5 attempts");
        let up = upstream(&server.base(), "flaky", &HttpPolicy::default());
        match connect(up.transport).await {
            Ok(client) => break (client, up.monitor),
            Err(error) => {
                let f = up.monitor.classify(&error);
                assert!(
                    matches!(&f, Failure::Retryable(m) if m.contains("500")),
                    "{f:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(attempts, 2, "one 500, then an answer");
    let tools = client.peer.request("tools/list", json!({})).await.unwrap();
    assert_eq!(tools["tools"][0]["name"], "echo");
    client.shutdown().await;
    assert!(!monitor.is_unauthorized());

    let seen = server.seen();
    assert!(seen.len() >= 4, "{seen:#?}");
    let host = server.addr.to_string();
    for s in &seen {
        assert_eq!(
            s.header("authorization"),
            Some(&*format!("Bearer {TOKEN}")),
            "{s:?}"
        );
        assert_eq!(s.header("x-api-key"), Some(KEY), "{s:?}");
        assert_eq!(s.header("host"), Some(host.as_str()), "{s:?}");
        assert!(s.target.starts_with("/mcp/flaky"), "{s:?}");
        // The server's own headers and the protocol's: nothing else of the job's.
        for (name, _) in &s.headers {
            assert!(
                [
                    "authorization",
                    "x-api-key",
                    "host",
                    "accept",
                    "content-type",
                    "content-length",
                    "mcp-session-id",
                    "mcp-protocol-version",
                ]
                .contains(&name.as_str()),
                "unexpected header {name} in {s:?}"
            );
        }
    }
    let initialize: Vec<_> = seen
        .iter()
        .filter(|s| s.rpc_method().as_deref() == Some("initialize"))
        .collect();
    assert_eq!(initialize.len(), 2);
    for s in initialize {
        let v: serde_json::Value = serde_json::from_str(&s.body).unwrap();
        assert_eq!(v["params"]["protocolVersion"], "2025-11-25", "{s:?}");
    }
}

#[tokio::test]
async fn answers_in_an_event_stream_are_read() {
    let server = FaultServer::start().await;
    let up = upstream(&server.base(), "mcp-sse", &HttpPolicy::default());
    let client = tokio::time::timeout(BOUND, connect(up.transport))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(client.tools[0].name, "echo");
    let result = client
        .peer
        .request(
            "tools/call",
            json!({"name": "echo", "arguments": {"message": "hi"}}),
        )
        .await
        .unwrap();
    let text = result["content"].to_string();
    assert!(text.contains("Echo: hi"), "{text}");
    client.shutdown().await;
}

#[tokio::test]
async fn an_answer_on_the_sessions_stream_ends_the_calls_wait() {
    // The call's stream ends with no answer (the client resumes it, in vain); the answer comes on
    // the session's own stream, and it is the call's.
    let server = FaultServer::start().await;
    let client = connected(&server, "answer-elsewhere").await;
    let call = echo(&client, "elsewhere");
    let result = tokio::time::timeout(BOUND, call)
        .await
        .expect("the answer on the session's stream is taken")
        .unwrap();
    assert_eq!(result["content"][0]["text"], "Echo: elsewhere");
    client.shutdown().await;
}

#[tokio::test]
async fn a_session_the_server_ended_is_started_anew_and_the_request_sent_again() {
    let server = FaultServer::start().await;
    let client = connected(&server, "expire").await;
    let call = echo(&client, "again");
    let result = tokio::time::timeout(BOUND, call).await.unwrap().unwrap();
    assert_eq!(result["content"][0]["text"], "Echo: again");
    let posts: Vec<(String, String)> = server
        .seen()
        .iter()
        .filter(|s| s.method == "POST")
        .map(|s| {
            (
                s.rpc_method().unwrap_or_default(),
                s.header("mcp-session-id").unwrap_or("none").to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("initialize", "none"),
        ("notifications/initialized", "session-1"),
        ("tools/list", "session-1"),
        ("tools/call", "session-1"),
        ("initialize", "none"),
        ("notifications/initialized", "session-2"),
        ("tools/call", "session-2"),
    ]
    .iter()
    .map(|(m, s)| (m.to_string(), s.to_string()))
    .collect();
    assert_eq!(posts, expected);
    client.shutdown().await;
}

#[tokio::test]
async fn a_body_over_16_mib_is_refused_as_it_streams() {
    let (rss_before, _) = memory();
    for kind in ["huge-json", "huge-sse", "huge-sse-events", "huge-declared"] {
        let server = FaultServer::start().await;
        let f = refused(&server, kind).await;
        assert!(
            fatal_with(&f, &["over", &MAX_BODY.to_string(), "bytes"]),
            "{kind}: {f:?}"
        );
        // The server stops when the client goes away; give its last write a moment to fail.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let written = server.huge_written();
        // Socket buffers hold a few MiB past the point where the client stopped reading.
        assert!(
            written < 64 * 1024 * 1024,
            "{kind}: the server wrote {written} bytes"
        );
        if kind == "huge-declared" {
            assert!(
                written < MAX_BODY,
                "{kind}: read {written} of a body declared too big"
            );
        } else {
            assert!(
                written >= MAX_BODY,
                "{kind}: refused after only {written} bytes"
            );
        }
    }
    let (rss_after, peak) = memory();
    let grown = peak.saturating_sub(rss_before);
    assert!(
        grown < 256 * 1024 * 1024,
        "the test process grew by {grown} bytes at its peak (RSS {rss_before} before, {rss_after} after) for bodies of {GIB}"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_is_bounded_by_the_wait() {
    let server = FaultServer::start().await;
    let up = upstream(&server.base(), "hang", &HttpPolicy::default());
    let monitor = up.monitor.clone();
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(Duration::from_millis(1500), connect(up.transport)).await;
    assert!(outcome.is_err(), "the hanging server answered");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(monitor.last_refusal(), None);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_refused_connection_is_retryable() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let up = upstream(
        &format!("http://127.0.0.1:{port}"),
        "mcp",
        &HttpPolicy::default(),
    );
    let error = error_of("a closed port", BOUND, connect(up.transport)).await;
    let f = classify(&error);
    assert!(
        matches!(&f, Failure::Retryable(m) if m.contains("could not connect")),
        "{f:?}"
    );
}

#[tokio::test]
async fn every_request_goes_through_the_proxy_given() {
    let proxy = FaultServer::start().await;
    let policy = HttpPolicy {
        proxy: Some(proxy.base()),
        ..HttpPolicy::default()
    };
    // A name that resolves nowhere: only the proxy can take the request.
    let up = upstream("http://mcp.invalid:8931", "mcp", &policy);
    let client = tokio::time::timeout(BOUND, connect(up.transport))
        .await
        .unwrap()
        .expect("connected through the proxy");
    client.peer.request("tools/list", json!({})).await.unwrap();
    client.shutdown().await;
    let seen = proxy.seen();
    assert!(seen.len() >= 3, "{seen:#?}");
    for s in &seen {
        assert!(
            s.target.starts_with("http://mcp.invalid:8931/mcp/mcp"),
            "not a proxied request: {s:?}"
        );
        assert_eq!(s.header("authorization"), Some(&*format!("Bearer {TOKEN}")));
    }
}

#[tokio::test]
async fn the_environments_proxy_is_never_used() {
    let upstream_server = FaultServer::start().await;
    let env_proxy = FaultServer::start().await;
    let out = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "environment_proxy_child",
            "--ignored",
            "--nocapture",
        ])
        .env("HTTP_CHILD_BASE", upstream_server.base())
        .env("HTTP_PROXY", env_proxy.base())
        .env("http_proxy", env_proxy.base())
        .env("HTTPS_PROXY", env_proxy.base())
        .env("https_proxy", env_proxy.base())
        .env("ALL_PROXY", env_proxy.base())
        .env("all_proxy", env_proxy.base())
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output();
    let out = tokio::time::timeout(BOUND, out).await.unwrap().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "the child ran no test"
    );
    // The control (a default reqwest client) reached the environment's proxy; ours did not.
    let through_proxy: Vec<String> = env_proxy.seen().into_iter().map(|s| s.kind).collect();
    assert_eq!(through_proxy, ["control"]);
    let direct: Vec<String> = upstream_server.seen().into_iter().map(|s| s.kind).collect();
    assert!(
        direct.iter().filter(|k| *k == "mcp").count() >= 3,
        "{direct:?}"
    );
    assert!(!direct.iter().any(|k| k == "control"), "{direct:?}");
}

/// Run by `the_environments_proxy_is_never_used` in a child process whose environment names a
/// proxy.
#[tokio::test]
#[ignore = "run in a child process by the_environments_proxy_is_never_used"]
async fn environment_proxy_child() {
    let base =
        std::env::var("HTTP_CHILD_BASE").expect("run by the_environments_proxy_is_never_used");
    // The control: reqwest's own detection finds the environment's proxy.
    let control = reqwest::Client::new()
        .get(format!("{base}/x/control"))
        .send()
        .await
        .unwrap();
    assert_eq!(control.status(), 404);
    let up = upstream(&base, "mcp", &HttpPolicy::default());
    let client = tokio::time::timeout(BOUND, connect(up.transport))
        .await
        .unwrap()
        .expect("connected directly");
    client.peer.request("tools/list", json!({})).await.unwrap();
    client.shutdown().await;
}

#[tokio::test]
async fn an_https_server_is_spoken_to_in_tls() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let first = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut byte = [0u8; 1];
        tokio::io::AsyncReadExt::read_exact(&mut stream, &mut byte)
            .await
            .unwrap();
        byte[0]
    });
    let up = upstream(
        &format!("https://127.0.0.1:{port}"),
        "mcp",
        &HttpPolicy::default(),
    );
    let error = error_of("no TLS server", BOUND, connect(up.transport)).await;
    // 0x16: a TLS handshake record, the client's hello.
    assert_eq!(first.await.unwrap(), 0x16);
    let f = classify(&error);
    assert!(!matches!(f, Failure::Unauthorized), "{f:?}");
}

#[tokio::test]
async fn an_accept_header_given_gives_way_to_the_protocols() {
    let server = FaultServer::start().await;
    let (url, headers) = resolved(
        &format!("{}/mcp/mcp", server.base()),
        &[("Accept", "${A}")],
        &[("A", "text/html")],
    );
    let up = transport(&url, &headers, &HttpPolicy::default()).unwrap();
    let client = connect(up.transport).await.unwrap();
    client.peer.request("tools/list", json!({})).await.unwrap();
    client.shutdown().await;
    for s in server.seen() {
        let accept: Vec<&str> = s
            .headers
            .iter()
            .filter(|(n, _)| n == "accept")
            .map(|(_, v)| v.as_str())
            .collect();
        let expected = if s.method == "POST" {
            vec!["application/json, text/event-stream"]
        } else if s.method == "GET" {
            vec!["text/event-stream"]
        } else {
            vec!["text/html"]
        };
        assert_eq!(accept, expected, "{s:?}");
    }
}

#[tokio::test]
async fn a_proxy_setting_that_is_no_url_is_refused() {
    let (url, headers) = resolved("http://127.0.0.1:9/mcp", &[], &[]);
    let policy = HttpPolicy {
        proxy: Some("http://[not a proxy".to_owned()),
        ..HttpPolicy::default()
    };
    assert_eq!(
        transport(&url, &headers, &policy).err(),
        Some(HttpError::Proxy)
    );
}

#[test]
fn the_policy_takes_the_proxy_for_the_servers_scheme() {
    let env = |name: &str| match name {
        "HTTPS_PROXY" => Some("http://egress:3128".to_owned()),
        "http_proxy" => Some("http://plain:3128".to_owned()),
        "NO_PROXY" => Some("*".to_owned()),
        _ => None,
    };
    let (https, _) = resolved("https://h.example.com/mcp", &[], &[]);
    let (http, _) = resolved("http://h.example.com/mcp", &[], &[]);
    assert_eq!(
        HttpPolicy::for_url(&https, &env).proxy.as_deref(),
        Some("http://egress:3128")
    );
    assert_eq!(
        HttpPolicy::for_url(&http, &env).proxy.as_deref(),
        Some("http://plain:3128")
    );
    assert_eq!(HttpPolicy::for_url(&https, &|_| None).proxy, None);
    assert_eq!(HttpPolicy::default().max_body, 16 * 1024 * 1024);
}
