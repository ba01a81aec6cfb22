//! The proxy on real connections: test hosts in network namespaces this test makes (root), names
//! answered by a nameserver of the test's, and the proxy's job socket as a job's runner uses it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use egress::dns::Resolver;
use egress::files::RuleFiles;
use egress::{Limits, Proxy};
use testkit::dns::FakeDns;
use testkit::netns::TestHost;

/// A server on `port` of `host` that answers each connection with `hello` and then echoes.
fn greeter(host: &TestHost, port: u16, hello: &'static [u8]) {
    let listener = host.tcp(port);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            std::thread::spawn(move || {
                let _ = s.write_all(hello);
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
}

struct World {
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
    proxy: Proxy,
    _rt: tokio::runtime::Runtime,
}

fn world(allowlist: &str, endpoints: &str, dns: &FakeDns) -> World {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("egress-allowlist.conf"), allowlist).unwrap();
    if !endpoints.is_empty() {
        std::fs::write(dir.path().join("model-endpoints.json"), endpoints).unwrap();
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let files = RuleFiles {
        allowlist: dir.path().join("egress-allowlist.conf"),
        endpoints: dir.path().join("model-endpoints.json"),
    };
    let proxy = {
        let _guard = rt.enter();
        Proxy::new(files, Resolver::Nameserver(dns.addr), Limits::default())
    };
    let socket = dir.path().join("job.sock");
    {
        let _guard = rt.enter();
        proxy.open_job("job-1", &socket).unwrap();
    }
    World {
        _dir: dir,
        socket,
        proxy,
        _rt: rt,
    }
}

/// Sends `request` on the job's socket; the proxy's status line and whatever came after it.
fn ask(socket: &Path, request: &str) -> (String, Vec<u8>) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            // A greeting after the head, if the tunnel opened.
            if got.len() > i + 4 || !got.starts_with(b"HTTP/1.1 200") {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&got).to_string();
    let status = text.lines().next().unwrap_or_default().to_owned();
    let body = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(Vec::new(), |i| got[i + 4..].to_vec());
    (status, body)
}

#[test]
fn an_allowlisted_host_on_443_is_reached_and_nothing_else_of_it() {
    let host = TestHost::new();
    greeter(&host, 443, b"hello from 443");
    greeter(&host, 8443, b"hello from 8443");
    let dns = FakeDns::start();
    dns.set("allowed.test", &[IpAddr::V4(host.v4)]);
    let w = world("allowed.test\n", "", &dns);
    let (status, body) = ask(
        &w.socket,
        "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n",
    );
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(body, b"hello from 443");
    let (status, _) = ask(&w.socket, "CONNECT allowed.test:8443 HTTP/1.1\r\n\r\n");
    assert!(status.starts_with("HTTP/1.1 403"), "{status}");
    let denied = w.proxy.denied("job-1").unwrap();
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!(
        (denied[0].host.as_str(), denied[0].port, denied[0].count),
        ("allowed.test", 8443, 1)
    );
}
