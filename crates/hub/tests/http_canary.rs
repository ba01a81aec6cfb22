//! A header value, a URL path segment and a query value holding canaries reach the server, and never
//! any message about a failure: not a classification, not the error the client returns (shown or
//! debugged), not the monitor's record, not a log line of the process (every `tracing` event and
//! span is captured here at every level).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod http_support;

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_support::{FaultServer, connect, error_of, resolved};
use hub::connect::classify;
use hub::http::{HttpPolicy, transport};

const PATH_CANARY: &str = "cnry-path-7f3a";
const QUERY_CANARY: &str = "cnry-query-91bd";
const HEADER_CANARY: &str = "cnry-header-c2e8";
const CANARIES: [&str; 3] = [PATH_CANARY, QUERY_CANARY, HEADER_CANARY];

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());
static NEXT_SPAN: AtomicU64 = AtomicU64::new(1);

/// Every event and span field, at every level, as text.
struct Capture;

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut fields = Fields(format!("span {} ", span.metadata().name()));
        span.record(&mut fields);
        LINES.lock().unwrap().push(fields.0);
        tracing::span::Id::from_u64(NEXT_SPAN.fetch_add(1, Ordering::SeqCst))
    }
    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut fields = Fields("record ".to_owned());
        values.record(&mut fields);
        LINES.lock().unwrap().push(fields.0);
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(format!(
            "{} {} ",
            event.metadata().level(),
            event.metadata().target()
        ));
        event.record(&mut fields);
        LINES.lock().unwrap().push(fields.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test]
async fn no_secret_reaches_a_message_or_a_log_line() {
    tracing::subscriber::set_global_default(Capture).expect("the only subscriber");
    let server = FaultServer::start().await;
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // Takes each connection and drops it: a TLS client gets no handshake.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = silent.accept().await {
            drop(stream);
        }
    });
    let mut messages: Vec<String> = Vec::new();

    // One of each failure class at connect: fatal, retryable, unauthorized, too big, the network.
    let kinds = [
        "redirect",
        "unauthorized",
        "status-403",
        "status-404",
        "status-501",
        "status-500",
        "status-429",
        "not-json",
        "huge-json",
        "huge-sse",
    ];
    let mut bases: Vec<(String, &str)> = kinds.iter().map(|k| (server.base(), *k)).collect();
    bases.push((format!("http://127.0.0.1:{closed_port}"), "mcp"));
    bases.push((format!("https://{silent_addr}"), "mcp"));
    for (base, kind) in &bases {
        let (url, headers) = secrets(base, kind);
        let up = transport(&url, &headers, &HttpPolicy::default()).unwrap();
        let monitor = up.monitor.clone();
        let error = error_of(kind, Duration::from_secs(20), connect(up.transport)).await;
        messages.push(format!("{kind}: {error}"));
        messages.push(format!("{kind}: {error:?}"));
        messages.push(format!("{kind}: {:?}", classify(&error)));
        messages.push(format!("{kind}: {:?}", monitor.classify(&error)));
        messages.push(format!("{kind}: {}", monitor.classify(&error).message()));
        messages.push(format!(
            "{kind}: {:?} {}",
            monitor.last_refusal(),
            monitor.origin()
        ));
    }

    // After connecting: a 401 on tools/call.
    let (url, headers) = secrets(&server.base(), "revoke");
    let up = transport(&url, &headers, &HttpPolicy::default()).unwrap();
    let client = connect(up.transport).await.unwrap();
    let error = client
        .peer
        .request("tools/call", serde_json::json!({"name": "echo"}))
        .await
        .unwrap_err();
    messages.push(format!(
        "revoke: {error} {error:?} {:?}",
        up.monitor.classify(&error)
    ));
    client.shutdown().await;

    // A server that never answers, given up on.
    let (url, headers) = secrets(&server.base(), "hang");
    let up = transport(&url, &headers, &HttpPolicy::default()).unwrap();
    let _ = tokio::time::timeout(Duration::from_millis(500), connect(up.transport)).await;
    messages.push(format!("{:?}", up.monitor));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The canaries did go out: the test would prove nothing otherwise.
    let seen = server.seen();
    assert!(
        seen.iter()
            .any(|s| s.target.contains(PATH_CANARY) && s.target.contains(QUERY_CANARY))
    );
    assert!(
        seen.iter()
            .all(|s| s.header("authorization") == Some(&*format!("Bearer {HEADER_CANARY}")))
    );

    let lines = LINES.lock().unwrap().clone();
    assert!(!lines.is_empty(), "the subscriber captured nothing");
    for text in messages.iter().chain(lines.iter()) {
        for canary in CANARIES {
            assert!(!text.contains(canary), "{canary} leaked: {text}");
        }
    }
}

fn secrets(base: &str, kind: &str) -> (hub::resolve::Secret, Vec<(String, hub::resolve::Secret)>) {
    resolved(
        &format!("{base}/${{P}}/{kind}?key=${{Q}}"),
        &[("Authorization", "Bearer ${H}")],
        &[
            ("P", PATH_CANARY),
            ("Q", QUERY_CANARY),
            ("H", HEADER_CANARY),
        ],
    )
}
