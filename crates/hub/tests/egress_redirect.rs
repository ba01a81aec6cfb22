//! An HTTP MCP server that answers the handshake with a redirect to a host the job may not reach:
//! the job's upstream client, going through the egress proxy as in a sandbox (a loopback port
//! forwarded to the job's proxy socket), refuses the redirect itself. The proxy never hears of the
//! other host: nothing denied, no decision about it in its log. The server is on a test host in a
//! network namespace of the test's (root), declared as an endpoint; names resolve at the proxy, from
//! a nameserver of the test's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod http_support;

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress::Proxy;
use egress::dns::Resolver;
use egress::files::RuleFiles;
use http_support::{connect, error_of, resolved};
use hub::http::{Failure, HttpPolicy, transport};
use testkit::dns::FakeDns;
use testkit::netns::TestHost;

const BOUND: Duration = Duration::from_secs(20);
const JOB: &str = "job-redirect";

/// Log lines caught in memory.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    fn lines(&self) -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// A server that reads each request (head and body), keeps it, and answers with `answer`.
fn answering(listener: TcpListener, answer: String) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            let head_end = loop {
                let Ok(n) = s.read(&mut buf) else { break None };
                if n == 0 {
                    break None;
                }
                got.extend_from_slice(&buf[..n]);
                if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    break Some(i + 4);
                }
            };
            let Some(head_end) = head_end else { continue };
            let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while got.len() < head_end + length {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            kept.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&got).to_string());
            let _ = s.write_all(answer.as_bytes());
        }
    });
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_an_unlisted_host_is_refused_before_the_proxy_sees_it() {
    let logs = Logs::default();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_writer(logs.clone())
            .finish(),
    )
    .unwrap();

    // The MCP server, declared, and the host it points to, unlisted.
    let mcp = TestHost::new();
    let elsewhere = TestHost::new();
    let seen = answering(
        mcp.tcp(8931),
        "HTTP/1.1 302 Found\r\nLocation: http://unlisted.test:8931/mcp\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            .to_owned(),
    );
    let unlisted = elsewhere.tcp(8931);
    let reached = Arc::new(AtomicUsize::new(0));
    let count = reached.clone();
    std::thread::spawn(move || {
        for _ in unlisted.incoming() {
            count.fetch_add(1, Ordering::SeqCst);
        }
    });
    let dns = FakeDns::start();
    dns.set("mcp.test", &[IpAddr::V4(mcp.v4)]);
    dns.set("unlisted.test", &[IpAddr::V4(elsewhere.v4)]);

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("egress-allowlist.conf"), "").unwrap();
    std::fs::write(
        dir.path().join("model-endpoints.json"),
        r#"{"version":1,"endpoints":[{"id":"mcp","host":"mcp.test","port":8931}]}"#,
    )
    .unwrap();
    let proxy = Proxy::new(
        RuleFiles {
            allowlist: dir.path().join("egress-allowlist.conf"),
            endpoints: dir.path().join("model-endpoints.json"),
        },
        Resolver::Nameserver(dns.addr),
        egress::Limits::default(),
    );
    let socket = dir.path().join("job.sock");
    proxy.open_job(JOB, &socket).unwrap();
    // As the runner does inside the sandbox: a loopback port that leads to the job's socket.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let forwarder = tokio::spawn(egress::forward::serve(listener, socket));

    let (url, headers) = resolved("http://mcp.test:8931/mcp", &[], &[]);
    let policy = HttpPolicy {
        proxy: Some(format!("http://127.0.0.1:{port}")),
        ..HttpPolicy::default()
    };
    let up = transport(&url, &headers, &policy).unwrap();
    let monitor = up.monitor.clone();
    let error = error_of("the redirecting server", BOUND, connect(up.transport)).await;
    let failure = monitor.classify(&error);
    assert!(
        matches!(&failure, Failure::Fatal(m) if m.contains("302") && m.contains("redirect")),
        "{failure:?}"
    );

    // The handshake went through the proxy to the server, as the server read it.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert!(seen[0].starts_with("POST /mcp HTTP/1.1\r\n"), "{}", seen[0]);
    assert!(seen[0].contains("\"initialize\""), "{}", seen[0]);
    // And nothing else: the other host was neither reached, nor asked for, nor looked up.
    assert_eq!(reached.load(Ordering::SeqCst), 0);
    assert_eq!(proxy.denied(JOB).unwrap(), []);
    assert_eq!(dns.asked("unlisted.test"), 0);
    let decisions: Vec<(String, u64, String)> = logs
        .lines()
        .into_iter()
        .filter(|l| l["event"] == "egress_decision" && l["job_id"] == JOB)
        .map(|l| {
            (
                l["host"].as_str().unwrap().to_owned(),
                l["port"].as_u64().unwrap(),
                l["verdict"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        decisions,
        [("mcp.test".to_owned(), 8931, "allowed".to_owned())]
    );
    forwarder.abort();
    proxy.close_all();
}
