//! One rule of egress: for a table of MCP server URLs, the pickup (`explain`), `doctor` and the
//! running egress proxy (`pi-dispatch egress-proxy`, asked as a job asks it) agree on which are
//! reachable. Names resolve at the proxy through a nameserver of the test's to a test host (a
//! network namespace the test makes) that answers on every port the table names.

use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::dns::FakeDns;
use testkit::netns::TestHost;

use crate::common::Deployment;

/// A server that answers anything with a line, on `port` of the test host.
fn answering(host: &TestHost, port: u16) {
    let listener = host.tcp(port);
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            let _ = s.write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
        }
    });
}

struct ProxyProcess(Child);

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the proxy says of `url` for a job: reached (`true`) or refused (`false`).
fn proxy_reaches(socket: &std::path::Path, url: &str) -> bool {
    let (scheme, rest) = url.split_once("://").unwrap();
    let authority = rest.split('/').next().unwrap();
    let request = if scheme == "https" {
        let authority = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()))
            && !authority.ends_with(']')
        {
            authority.to_owned()
        } else {
            format!("{authority}:443")
        };
        format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n")
    } else {
        format!("GET {url} HTTP/1.1\r\nHost: {authority}\r\n\r\n")
    };
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    let status = String::from_utf8_lossy(&head[9..12]).to_string();
    match status.as_str() {
        // Let through; 502: nothing listens there, which is the upstream's answer, not a refusal.
        "200" | "204" | "502" => true,
        "403" => false,
        other => panic!("{url}: the proxy answered {other}"),
    }
}

#[test]
fn pickup_doctor_and_the_proxy_agree_on_every_url() {
    let host = TestHost::new();
    for port in [80, 443, 8000, 8001, 8443] {
        answering(&host, port);
    }
    let dns = FakeDns::start();
    let at = [IpAddr::V4(host.v4)];
    for name in [
        "a.example.test",
        "b.example.test",
        "x.sub.example.test",
        "sub.example.test",
        "ep.example.test",
    ] {
        dns.set(name, &at);
    }
    let v4 = host.v4;
    // (url, reachable)
    let table: Vec<(String, bool)> = vec![
        ("https://a.example.test/mcp".into(), true),
        ("https://b.example.test/mcp".into(), false),
        ("https://a.example.test:8443/mcp".into(), false),
        ("http://a.example.test/mcp".into(), false),
        ("https://x.sub.example.test/mcp".into(), true),
        ("https://sub.example.test/mcp".into(), false),
        ("http://ep.example.test:8000/mcp".into(), true),
        ("https://ep.example.test:8000/mcp".into(), true),
        ("http://ep.example.test:8001/mcp".into(), false),
        ("http://ep.example.test:8002/mcp".into(), true),
        (format!("https://{v4}/mcp"), true),
        ("https://127.0.0.1/mcp".into(), false),
        ("https://localhost/mcp".into(), false),
    ];
    let d = Deployment::new();
    assert_eq!(d.run(&["init"]).code, 0);
    let repo = d.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let chown = std::process::Command::new("chown")
        .arg("65534:65534")
        .arg(&repo)
        .status()
        .unwrap();
    assert!(chown.success());
    d.write(
        "images/pi-job/image.json",
        r#"{"labels": {"dev.pi-dispatch.capabilities": "mcp"}}"#,
    );
    d.write("images/pi-job/bin/pi-dispatch", "");
    d.write(
        "egress-allowlist.conf",
        &format!("a.example.test\n.sub.example.test\n{v4}\nlocalhost\n127.0.0.1\n"),
    );
    d.write(
        "model-endpoints.json",
        r#"{"version": 1, "endpoints": [{"id": "ep", "host": "ep.example.test", "port": 8000}, {"id": "silent", "host": "ep.example.test", "port": 8002}]}"#,
    );
    let servers: Vec<String> = table
        .iter()
        .enumerate()
        .map(|(i, (url, _))| format!(r#""s{i}": {{"url": "{url}", "description": "S"}}"#))
        .collect();
    d.write(
        "pi-global/mcp.json",
        &format!(r#"{{"mcpServers": {{{}}}}}"#, servers.join(",")),
    );
    let triggers: Vec<String> = (0..table.len())
        .map(|i| {
            format!(
                r#"{{"on": {{"type": "cron", "id": "t{i}", "pattern": "0 3 * * *"}}, "run": {{"kind": "local", "flow": "fix", "folder": "{}", "task": "T", "mcp": ["s{i}"]}}}}"#,
                repo.display()
            )
        })
        .collect();
    d.write(
        "triggers.json",
        &format!(r#"{{"triggers": [{}]}}"#, triggers.join(",")),
    );
    d.write(
        ".env",
        &format!("PI_JOB_IMAGE=pi-job\nPI_PROVIDER=openai\nPI_MODEL=gpt-4o\nOPENAI_API_KEY=k-1\nPI_EGRESS_NAMESERVER={}\n", dns.addr),
    );

    // The proxy, as the worker would run it; the test asks it through a job socket of its own.
    let mut cmd = d.command(&["egress-proxy"]);
    let proxy = ProxyProcess(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let control = egress::control::Client::new(d.path().join("state/egress/control.sock"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while control.ping().is_err() {
        assert!(Instant::now() < deadline, "the proxy never answered");
        std::thread::sleep(Duration::from_millis(20));
    }
    let socket = d.path().join("agree.sock");
    control.open("agree", &socket).unwrap();

    let doctor: Value = serde_json::from_str(&d.run(&["doctor", "--json"]).stdout).unwrap();
    let checks = doctor["checks"].as_array().unwrap();
    assert!(
        checks.iter().any(|c| c["label"]
            .as_str()
            .unwrap()
            .starts_with("egress proxy: running")),
        "{doctor:#}"
    );
    for (i, (url, reachable)) in table.iter().enumerate() {
        let explain: Value = serde_json::from_str(
            &d.run(&["explain", "--trigger", &i.to_string(), "--json"])
                .stdout,
        )
        .unwrap();
        let pickup = match explain["reason"].as_str() {
            None => true,
            Some("mcp-egress-unreachable") => false,
            Some(other) => panic!("{url}: explain refused it for {other}"),
        };
        let name = format!("server s{i} ");
        let out_of_reach = checks.iter().any(|c| {
            let l = c["label"].as_str().unwrap();
            l.starts_with(&name) && l.contains("out of the egress proxy's reach")
        });
        let by_proxy = proxy_reaches(&socket, url);
        assert_eq!(
            (pickup, !out_of_reach, by_proxy),
            (*reachable, *reachable, *reachable),
            "{url}: (pickup, doctor, proxy)"
        );
    }
    // The declared endpoints no model uses: doctor proved the route through the proxy where
    // something answers, and says so where nothing does.
    let label = |words: &str| {
        checks
            .iter()
            .find(|c| c["label"].as_str().unwrap().contains(words))
            .unwrap_or_else(|| panic!("no check with {words:?}: {doctor:#}"))
            .clone()
    };
    let proven = label("the route to declared endpoint ep (ep.example.test:8000) is proven");
    assert_eq!(proven["level"], "ok");
    let silent = label("declared endpoint silent (ep.example.test:8002)");
    assert_eq!(silent["level"], "warn", "{silent:#}");
    assert!(
        silent["label"]
            .as_str()
            .unwrap()
            .contains("nothing answers there"),
        "{silent:#}"
    );
    // Each name the proxy reached was looked up, each time, at the nameserver of the test.
    assert!(dns.asked("a.example.test") > 0);
    drop(proxy);
}
