//! The proxy on real connections: test hosts in network namespaces this test makes (root), names
//! answered by a nameserver of the test's, servers of the test's on this machine where a job must
//! not go, and the proxy's job socket as a job's runner uses it. Each case checks what the client
//! got (the status, and whose greeting) and what the proxy recorded as denied.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};

use support::{
    JOB, World, denied, direct, greeter, greeter_on, greeting, header_names, http, http_on,
    loopback_443, neighbouring_ports,
};
use testkit::dns::{FakeDns, Record};
use testkit::netns::TestHost;

fn v4(a: Ipv4Addr) -> IpAddr {
    IpAddr::V4(a)
}

fn v6(a: Ipv6Addr) -> IpAddr {
    IpAddr::V6(a)
}

#[test]
fn an_allowlisted_host_on_443_is_reached_and_nothing_else_of_it() {
    let host = TestHost::new();
    greeter(&host, 443, "allowed:443");
    let other_port = greeter(&host, 8443, "allowed:8443");
    let stranger = TestHost::new();
    let unlisted = greeter(&stranger, 443, "unlisted:443");
    let dns = FakeDns::start();
    dns.set("allowed.test", &[v4(host.v4)]);
    dns.set("unlisted.test", &[v4(stranger.v4)]);
    let w = World::new("allowed.test\n", "", &dns);

    let r = w.connect("allowed.test:443");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, greeting("allowed:443", v4(host.v4)));

    for _ in 0..2 {
        let r = w.connect("allowed.test:8443");
        assert!(r.refused(403, "not-allowed"), "{r:?}");
    }
    let r = w.connect("unlisted.test:443");
    assert!(r.refused(403, "not-allowed"), "{r:?}");
    // Written another way, the unlisted host is the same host.
    let r = w.connect("Unlisted.Test.:443");
    assert!(r.refused(403, "not-allowed"), "{r:?}");

    assert_eq!(other_port.accepted(), 0);
    assert_eq!(unlisted.accepted(), 0);
    // A host the rule refuses is not even looked up.
    assert_eq!(dns.asked("unlisted.test"), 0);
    assert_eq!(
        w.denied(),
        denied(&[
            ("allowed.test", 8443, 2, "not-allowed"),
            ("unlisted.test", 443, 2, "not-allowed"),
        ])
    );
}

#[test]
fn an_allowlisted_name_that_is_this_machine_is_refused() {
    let loopback = loopback_443();
    // The test host's gateway end is an address of this namespace: this machine's own.
    let host = TestHost::new();
    let own_v4 = greeter_on(
        TcpListener::bind((host.gateway_v4, 443)).unwrap(),
        "gateway-v4",
    );
    let own_v6 = greeter_on(
        TcpListener::bind((host.gateway_v6, 443)).unwrap(),
        "gateway-v6",
    );
    let named = greeter(&host, 443, "named-host");
    // Each of these is reachable from here: only the proxy's check stands in the way.
    let before = loopback.accepted();
    for addr in ["127.0.0.1:443", "[::1]:443", "0.0.0.0:443", "[::]:443"] {
        let addr: SocketAddr = addr.parse().unwrap();
        assert!(direct(addr).starts_with("loopback at"), "{addr}");
    }
    assert_eq!(loopback.accepted(), before + 4);
    assert_eq!(
        direct((host.gateway_v4, 443).into()),
        greeting("gateway-v4", v4(host.gateway_v4))
    );
    assert_eq!(
        direct((host.gateway_v6, 443).into()),
        greeting("gateway-v6", v6(host.gateway_v6))
    );
    let (before, own_before) = (loopback.accepted(), own_v4.accepted() + own_v6.accepted());

    let dns = FakeDns::start();
    let names: [(&str, IpAddr, &str); 8] = [
        ("loop4.test", v4(Ipv4Addr::LOCALHOST), "special-address"),
        (
            "loop4b.test",
            "127.9.9.9".parse().unwrap(),
            "special-address",
        ),
        ("loop6.test", v6(Ipv6Addr::LOCALHOST), "special-address"),
        ("zero4.test", v4(Ipv4Addr::UNSPECIFIED), "special-address"),
        ("zero6.test", v6(Ipv6Addr::UNSPECIFIED), "special-address"),
        (
            "mapped.test",
            "::ffff:127.0.0.1".parse().unwrap(),
            "special-address",
        ),
        ("own4.test", v4(host.gateway_v4), "own-machine"),
        ("own6.test", v6(host.gateway_v6), "own-machine"),
    ];
    let mut allowlist = String::new();
    for (name, addr, _) in &names {
        dns.set(name, &[*addr]);
        allowlist.push_str(&format!("{name}\n"));
    }
    // This machine's own name, even where it resolves to a test host's address.
    let hostname = egress::proxy::host_name().to_ascii_lowercase();
    let by_name = config::egress::parse_allowlist(&format!("{hostname}\n")).is_ok();
    if by_name {
        dns.set(&hostname, &[v4(host.v4)]);
        allowlist.push_str(&format!("{hostname}\n"));
    } else {
        eprintln!("this machine's name is no allowlist entry: its case is not checked");
    }
    let w = World::new(&allowlist, "", &dns);

    let mut expected = Vec::new();
    for (name, _, code) in &names {
        let r = w.connect(&format!("{name}:443"));
        assert!(r.refused(403, code), "{name}: {r:?}");
        expected.push((*name, 443, 1, *code));
    }
    if by_name {
        let r = w.connect(&format!("{hostname}:443"));
        assert!(r.refused(403, "own-machine"), "{r:?}");
        expected.push((&hostname, 443, 1, "own-machine"));
    }
    assert_eq!(loopback.accepted(), before, "a job reached this machine");
    assert_eq!(own_v4.accepted() + own_v6.accepted(), own_before);
    assert_eq!(named.accepted(), 0);
    assert_eq!(w.denied(), denied(&expected));
}

#[test]
fn an_allowlisted_name_on_an_address_no_peer_has_is_refused() {
    let host = TestHost::new();
    let peer = greeter(&host, 443, "peer");
    // A link-local address on the test host, routed from here: reachable, as a cloud's metadata
    // address is.
    let [_, _, c, d] = host.v4.octets();
    let link_local = Ipv4Addr::new(169, 254, c, d);
    let inside = |args: &[&str]| {
        let mut all = vec!["netns", "exec", &host.name, "ip"];
        all.extend_from_slice(args);
        run_ip(&all);
    };
    inside(&["addr", "add", &format!("{link_local}/32"), "dev", "lo"]);
    run_ip(&[
        "route",
        "add",
        &format!("{link_local}/32"),
        "via",
        &host.v4.to_string(),
    ]);
    assert_eq!(
        direct((link_local, 443).into()),
        greeting("peer", v4(link_local))
    );

    let dns = FakeDns::start();
    let names: [(&str, &[IpAddr]); 8] = [
        ("metadata.test", &[v4(link_local)]),
        ("linklocal6.test", &["fe80::1".parse().unwrap()]),
        ("multicast4.test", &["224.0.0.1".parse().unwrap()]),
        ("multicast6.test", &["ff02::1".parse().unwrap()]),
        ("broadcast.test", &[v4(Ipv4Addr::BROADCAST)]),
        ("thisnet.test", &["0.1.2.3".parse().unwrap()]),
        ("mapped-ll.test", &["::ffff:169.254.1.1".parse().unwrap()]),
        // One bad answer among good ones refuses the name: a retry cannot pick it.
        ("mixed.test", &[v4(host.v4), v4(Ipv4Addr::LOCALHOST)]),
    ];
    let mut allowlist = String::new();
    for (name, addrs) in &names {
        dns.set(name, addrs);
        allowlist.push_str(&format!("{name}\n"));
    }
    let w = World::new(&allowlist, "", &dns);
    let peer_before = peer.accepted();
    let mut expected = Vec::new();
    for (name, _) in &names {
        let r = w.connect(&format!("{name}:443"));
        assert!(r.refused(403, "special-address"), "{name}: {r:?}");
        expected.push((*name, 443, 1, "special-address"));
    }
    assert_eq!(peer.accepted(), peer_before, "the test host was reached");
    assert_eq!(w.denied(), denied(&expected));
}

fn run_ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_name_is_resolved_once_and_the_address_checked_is_the_one_reached() {
    let loopback = loopback_443();
    let host = TestHost::new();
    greeter(&host, 443, "rebound");
    let dns = FakeDns::start();
    // A rebinding nameserver: the test host at the first question, this machine afterwards.
    dns.set_turns("rebind.test", &[&[v4(host.v4)], &[v4(Ipv4Addr::LOCALHOST)]]);
    let w = World::new("rebind.test\n", "", &dns);
    let before = loopback.accepted();

    let r = w.connect("rebind.test:443");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, greeting("rebound", v4(host.v4)));
    assert_eq!(dns.asked_for("rebind.test", Record::A), 1);
    assert_eq!(dns.asked_for("rebind.test", Record::Aaaa), 1);

    // The next request asks again (no answer is kept), and now the name is this machine.
    let r = w.connect("rebind.test:443");
    assert!(r.refused(403, "special-address"), "{r:?}");
    assert_eq!(dns.asked_for("rebind.test", Record::A), 2);
    assert_eq!(loopback.accepted(), before);
    assert_eq!(
        w.denied(),
        denied(&[("rebind.test", 443, 1, "special-address")])
    );
}

const MODEL: &str = r#"{"version":1,"endpoints":[{"id":"gpu","host":"model.test","port":8000}]}"#;

#[test]
fn a_declared_endpoint_is_reached_on_its_exact_port_by_connect_and_by_a_plain_request() {
    let host = TestHost::new();
    let model = http(&host, 8000, "model:8000");
    let neighbour = http(&host, 8001, "model:8001");
    let dns = FakeDns::start();
    dns.set("model.test", &[v4(host.v4)]);
    let w = World::new("", MODEL, &dns);

    // CONNECT, and a request inside the tunnel.
    let mut s = tunnel_raw(&w, "model.test:8000");
    use std::io::Write;
    s.write_all(b"GET /in-tunnel HTTP/1.1\r\nHost: model.test:8000\r\n\r\n")
        .unwrap();
    let r = support::read_reply(&mut s, false);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, greeting("model:8000", v4(host.v4)));

    // A plain request: absolute-form in, origin-form out, nothing of the proxy's passed on.
    let r = w.ask(
        "GET http://model.test:8000/v1/models?limit=1 HTTP/1.1\r\n\
         Host: elsewhere.test\r\n\
         Accept: application/json\r\n\
         Proxy-Authorization: Basic dXNlcjpwYXNz\r\n\
         Proxy-Connection: keep-alive\r\n\
         Proxy-Token: t0ken\r\n\
         Connection: keep-alive\r\n\
         Keep-Alive: timeout=5\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, greeting("model:8000", v4(host.v4)));
    // And a body goes with its request.
    let r = w.ask(
        "POST http://model.test:8000/v1/chat/completions HTTP/1.1\r\n\
         Host: model.test:8000\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n\
         {\"a\":\"b12\"}",
    );
    assert_eq!(r.status, 200, "{r:?}");

    let seen = model.seen();
    assert_eq!(seen.len(), 3, "{seen:#?}");
    assert!(
        seen[0].starts_with("GET /in-tunnel HTTP/1.1\r\n"),
        "{seen:#?}"
    );
    let plain = &seen[1];
    assert!(
        plain.starts_with("GET /v1/models?limit=1 HTTP/1.1\r\n"),
        "{plain}"
    );
    let names = header_names(plain);
    assert!(
        names.iter().all(|n| !n.starts_with("proxy-")),
        "a proxy header went upstream: {plain}"
    );
    assert!(!names.contains("keep-alive"), "{plain}");
    assert!(plain.contains("\r\nConnection: close\r\n"), "{plain}");
    assert_eq!(plain.matches("\r\nConnection:").count(), 1, "{plain}");
    assert!(
        plain.contains("\r\nAccept: application/json\r\n"),
        "{plain}"
    );
    // The host asked for, not the one the client wrote (RFC 9112, 3.2.2).
    assert!(plain.contains("\r\nHost: model.test:8000\r\n"), "{plain}");
    assert_eq!(plain.matches("\r\nHost:").count(), 1, "{plain}");
    assert!(
        seen[2].starts_with("POST /v1/chat/completions HTTP/1.1\r\n")
            && seen[2].ends_with("\r\n\r\n{\"a\":\"b12\"}"),
        "{}",
        seen[2]
    );

    // The port next to it is not declared.
    let r = w.connect("model.test:8001");
    assert!(r.refused(403, "not-allowed"), "{r:?}");
    let r = w.ask("GET http://model.test:8001/v1/models HTTP/1.1\r\nHost: model.test:8001\r\n\r\n");
    assert!(r.refused(403, "not-allowed"), "{r:?}");
    assert_eq!(neighbour.accepted(), 0);
    assert_eq!(
        w.denied(),
        denied(&[("model.test", 8001, 2, "not-allowed")])
    );
}

/// A tunnel through job [`JOB`]'s socket, the proxy's head read.
fn tunnel_raw(w: &World, authority: &str) -> std::os::unix::net::UnixStream {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(w.socket()).unwrap();
    s.set_read_timeout(Some(support::BOUND)).unwrap();
    write!(s, "CONNECT {authority} HTTP/1.1\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut byte).unwrap(),
            1,
            "{:?}",
            String::from_utf8_lossy(&got)
        );
        got.push(byte[0]);
    }
    let head = String::from_utf8(got).unwrap();
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    s
}

#[test]
fn a_local_model_server_is_reached_on_its_port_and_nothing_else_of_this_machine() {
    let loopback = loopback_443();
    let (server, next) = neighbouring_ports(v4(Ipv4Addr::LOCALHOST));
    let port = server.local_addr().unwrap().port();
    let local = http_on(server, "local-model");
    let next = greeter_on(next, "local-next");
    let endpoints = format!(
        r#"{{"version":1,"endpoints":[{{"id":"local","host":"127.0.0.1","port":{port}}}]}}"#
    );
    let dns = FakeDns::start();
    let w = World::new("", &endpoints, &dns);
    let before = loopback.accepted();

    let mut s = tunnel_raw(&w, &format!("127.0.0.1:{port}"));
    use std::io::Write;
    s.write_all(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let r = support::read_reply(&mut s, false);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, greeting("local-model", v4(Ipv4Addr::LOCALHOST)));
    let r = w.ask(&format!(
        "GET http://127.0.0.1:{port}/v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    ));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, greeting("local-model", v4(Ipv4Addr::LOCALHOST)));
    assert_eq!(local.seen().len(), 2);

    let next_port = port + 1;
    for authority in [
        format!("127.0.0.1:{next_port}"),
        "127.0.0.1:443".to_owned(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        format!("0.0.0.0:{port}"),
    ] {
        let r = w.connect(&authority);
        assert!(r.refused(403, "loopback"), "{authority}: {r:?}");
    }
    let r = w.ask(&format!(
        "GET http://127.0.0.1:{next_port}/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    ));
    assert!(r.refused(403, "loopback"), "{r:?}");
    assert_eq!(next.accepted(), 0);
    assert_eq!(loopback.accepted(), before);
    assert_eq!(
        w.denied(),
        denied(&[
            ("0.0.0.0", port, 1, "loopback"),
            ("127.0.0.1", 443, 1, "loopback"),
            ("127.0.0.1", next_port, 2, "loopback"),
            ("[::1]", port, 1, "loopback"),
            ("localhost", port, 1, "loopback"),
        ])
    );
}

#[test]
fn plain_http_goes_only_to_declared_endpoints() {
    let host = TestHost::new();
    let on_80 = http(&host, 80, "allowed:80");
    let on_8080 = http(&host, 8080, "allowed:8080");
    let on_443 = http(&host, 443, "allowed:443");
    let dns = FakeDns::start();
    dns.set("allowed.test", &[v4(host.v4)]);
    let w = World::new("allowed.test\n", "", &dns);

    for (uri, code) in [
        ("http://allowed.test/", "not-allowed"),
        ("http://allowed.test:80/index.html", "not-allowed"),
        ("http://allowed.test:8080/", "not-allowed"),
        ("http://allowed.test:443/", "plain-http-443"),
    ] {
        let r = w.ask(&format!("GET {uri} HTTP/1.1\r\nHost: allowed.test\r\n\r\n"));
        assert!(r.refused(403, code), "{uri}: {r:?}");
    }
    assert_eq!(on_80.accepted() + on_8080.accepted() + on_443.accepted(), 0);
    assert_eq!(
        w.denied(),
        denied(&[
            ("allowed.test", 80, 2, "not-allowed"),
            ("allowed.test", 443, 1, "plain-http-443"),
            ("allowed.test", 8080, 1, "not-allowed"),
        ])
    );
}

#[test]
fn a_raw_address_is_reached_only_once_listed() {
    let host = TestHost::new();
    greeter(&host, 443, "raw");
    let dns = FakeDns::start();
    let w = World::new("", "", &dns);
    let (a4, a6) = (host.v4.to_string(), format!("[{}]", host.v6));

    let r = w.connect(&format!("{a4}:443"));
    assert!(r.refused(403, "not-allowed"), "{r:?}");
    let r = w.connect(&format!("{a6}:443"));
    assert!(r.refused(403, "not-allowed"), "{r:?}");

    w.write_allowlist(&format!("{a4}\n{a6}\n{}\n", host.gateway_v4));
    let r = w.connect(&format!("{a4}:443"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, greeting("raw", v4(host.v4)));
    let r = w.connect(&format!("{a6}:443"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, greeting("raw", v6(host.v6)));
    // Listed or not, this machine's own address is never reached.
    let r = w.connect(&format!("{}:443", host.gateway_v4));
    assert!(r.refused(403, "own-machine"), "{r:?}");
    // Nor is another port of a listed address.
    let r = w.connect(&format!("{a4}:444"));
    assert!(r.refused(403, "not-allowed"), "{r:?}");

    assert_eq!(
        w.denied(),
        denied(&[
            (&a4, 443, 1, "not-allowed"),
            (&a4, 444, 1, "not-allowed"),
            (&host.gateway_v4.to_string(), 443, 1, "own-machine"),
            (&a6, 443, 1, "not-allowed"),
        ])
    );
}

#[test]
fn a_name_with_only_an_ipv6_address_is_reached_over_ipv6() {
    let host = TestHost::new();
    greeter(&host, 443, "six");
    let dns = FakeDns::start();
    dns.set("six.test", &[v6(host.v6)]);
    let w = World::new("six.test\n", "", &dns);
    let r = w.connect("six.test:443");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, greeting("six", v6(host.v6)));
    assert_eq!(dns.asked_for("six.test", Record::Aaaa), 1);
    assert_eq!(w.denied(), denied(&[]));
}

#[test]
fn the_files_are_read_again_when_they_change() {
    let host = TestHost::new();
    greeter(&host, 443, "host:443");
    let model = http(&host, 8000, "model:8000");
    let dns = FakeDns::start();
    for name in [
        "first.test",
        "later.test",
        "model.test",
        "aaaa.test",
        "bbbb.test",
    ] {
        dns.set(name, &[v4(host.v4)]);
    }
    let w = World::new("first.test\n", "", &dns);

    assert_eq!(w.connect("first.test:443").status, 200);
    let r = w.connect("later.test:443");
    assert!(r.refused(403, "not-allowed"), "{r:?}");
    let plain = "GET http://model.test:8000/v1/models HTTP/1.1\r\nHost: model.test:8000\r\n\r\n";
    let r = w.ask(plain);
    assert!(r.refused(403, "not-allowed"), "{r:?}");

    // Added while the proxy runs: the next request passes.
    w.write_allowlist("first.test\nlater.test\n");
    let r = w.connect("later.test:443");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, greeting("host:443", v4(host.v4)));
    w.write_endpoints(MODEL);
    let r = w.ask(plain);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(model.seen().len(), 1);

    // A file that cannot be read refuses everything, the endpoints too, until it is fixed.
    w.write_allowlist("first.test\nhttps://later.test\n");
    let r = w.connect("first.test:443");
    assert!(r.refused(403, "rules-unreadable"), "{r:?}");
    let r = w.ask(plain);
    assert!(r.refused(403, "rules-unreadable"), "{r:?}");
    w.write_allowlist("first.test\nlater.test\n");
    assert_eq!(w.connect("first.test:443").status, 200);
    w.write_endpoints("{\"version\":1,");
    let r = w.connect("first.test:443");
    assert!(r.refused(403, "rules-unreadable"), "{r:?}");
    w.write_endpoints(MODEL);
    assert_eq!(w.ask(plain).status, 200);

    // A change that keeps the size and puts the old modification time back is a change too.
    w.write_allowlist("aaaa.test\n");
    assert_eq!(w.connect("aaaa.test:443").status, 200);
    let stamp = std::fs::metadata(w.allowlist_path())
        .unwrap()
        .modified()
        .unwrap();
    w.write_allowlist("bbbb.test\n");
    std::fs::File::options()
        .write(true)
        .open(w.allowlist_path())
        .unwrap()
        .set_modified(stamp)
        .unwrap();
    let r = w.connect("bbbb.test:443");
    assert_eq!(r.status, 200, "{r:?}");
    let r = w.connect("aaaa.test:443");
    assert!(r.refused(403, "not-allowed"), "{r:?}");

    assert_eq!(
        w.denied(),
        denied(&[
            ("aaaa.test", 443, 1, "not-allowed"),
            ("first.test", 443, 2, "rules-unreadable"),
            ("later.test", 443, 1, "not-allowed"),
            // Refused twice, for two reasons: the row keeps the first.
            ("model.test", 8000, 2, "not-allowed"),
        ])
    );
}

#[test]
fn one_log_line_a_decision_and_never_a_path_or_a_query() {
    let host = TestHost::new();
    greeter(&host, 443, "host:443");
    http(&host, 8000, "model:8000");
    let dns = FakeDns::start();
    dns.set("allowed.test", &[v4(host.v4)]);
    dns.set("model.test", &[v4(host.v4)]);
    let w = World::new("allowed.test\n", MODEL, &dns);
    let canary = "cnry-7f3a";

    assert_eq!(w.connect("allowed.test:443").status, 200);
    assert_eq!(w.connect("allowed.test:22").status, 403);
    let r = w.ask(&format!(
        "GET http://model.test:8000/{canary}/path?key={canary}-q HTTP/1.1\r\nHost: model.test:8000\r\n\r\n"
    ));
    assert_eq!(r.status, 200, "{r:?}");
    let r = w.ask(&format!(
        "GET http://allowed.test/{canary}/path?key={canary}-q HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
    ));
    assert_eq!(r.status, 403, "{r:?}");
    // Refused before any decision: no line with a host, and still no path.
    let r = w.ask(&format!(
        "GET /{canary}/origin-form?{canary} HTTP/1.1\r\nHost: x\r\n\r\n"
    ));
    assert!(r.refused(400, "bad-request"), "{r:?}");

    let decisions = w.logs.decisions(JOB);
    let got: Vec<(String, u64, String)> = decisions
        .iter()
        .map(|l| {
            (
                l["host"].as_str().unwrap().to_owned(),
                l["port"].as_u64().unwrap(),
                l["verdict"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("allowed.test".to_owned(), 443, "allowed".to_owned()),
            ("allowed.test".to_owned(), 22, "denied".to_owned()),
            ("model.test".to_owned(), 8000, "allowed".to_owned()),
            ("allowed.test".to_owned(), 80, "denied".to_owned()),
        ],
        "{}",
        w.logs.text()
    );
    assert_eq!(decisions[1]["reason"], "not-allowed");
    let text = w.logs.text();
    assert!(
        !text.contains(canary),
        "a path or a query was logged:\n{text}"
    );
    assert!(text.contains("\"reason\":\"bad-request\""), "{text}");
}
