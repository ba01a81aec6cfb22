//! The proxy against clients that do not play along: heads too large, too slow or not HTTP at all,
//! a thousand tunnels at once, more connections than a job or the proxy may hold, and a tunnel
//! left idle. After each, the proxy still serves a good request.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use egress::Limits;
use support::{
    BOUND, JOB, World, ask, async_greeter_on, denied, greeting, raise_open_files, read_reply,
    tunnel, wait_until,
};
use testkit::dns::FakeDns;
use testkit::netns::TestHost;

/// A test host with a greeter on 443 named `allowed.test`, and a proxy that allows it.
fn allowed(limits: Limits) -> (TestHost, FakeDns, World) {
    let host = TestHost::new();
    let dns = FakeDns::start();
    dns.set("allowed.test", &[IpAddr::V4(host.v4)]);
    let w = World::with_limits("allowed.test\n", "", &dns, limits);
    async_greeter_on(&w.rt, host.tcp(443), "allowed");
    (host, dns, w)
}

/// A good request is served: the tunnel opens and the greeting comes.
fn serves(w: &World, host: &TestHost) {
    let r = w.connect("allowed.test:443");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, greeting("allowed", IpAddr::V4(host.v4)));
}

#[test]
fn an_oversized_head_is_refused_and_the_proxy_serves_on() {
    let (host, _dns, w) = allowed(Limits::default());
    let max = w.proxy.limits().max_head;

    // One header larger than the bound, whole, then one that never ends.
    let big = format!(
        "CONNECT allowed.test:443 HTTP/1.1\r\nX-Fill: {}\r\n\r\n",
        "a".repeat(max)
    );
    let r = ask(&w.socket(), big.as_bytes());
    assert!(r.refused(431, "head-too-large"), "{r:?}");
    let endless = format!(
        "CONNECT allowed.test:443 HTTP/1.1\r\nX-Fill: {}",
        "a".repeat(4 * max)
    );
    let r = ask(&w.socket(), endless.as_bytes());
    assert!(r.refused(431, "head-too-large"), "{r:?}");
    // Many small headers, well within the bytes.
    let mut many = "CONNECT allowed.test:443 HTTP/1.1\r\n".to_owned();
    for i in 0..200 {
        many.push_str(&format!("X-{i}: 1\r\n"));
    }
    many.push_str("\r\n");
    assert!(many.len() < max);
    let r = ask(&w.socket(), many.as_bytes());
    assert!(r.refused(431, "head-too-large"), "{r:?}");

    serves(&w, &host);
    assert_eq!(w.denied(), denied(&[]));
}

#[test]
fn a_slow_client_is_cut_off_while_others_are_served() {
    let limit = Duration::from_secs(1);
    let (host, _dns, w) = allowed(Limits {
        head_timeout: limit,
        ..Limits::default()
    });
    let request = b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n";
    let (started_tx, started) = mpsc::channel();
    let mut slow = Vec::new();
    for _ in 0..5 {
        let socket = w.socket();
        let started_tx = started_tx.clone();
        slow.push(std::thread::spawn(move || {
            // Before connecting: the proxy's clock for this head starts after.
            let opened = Instant::now();
            let mut s = UnixStream::connect(&socket).unwrap();
            // A byte a second: the wait for an answer between bytes is the pace.
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            let mut sent = 0;
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            loop {
                if sent < request.len() && s.write_all(&request[sent..=sent]).is_ok() {
                    sent += 1;
                    if sent == 1 {
                        started_tx.send(()).unwrap();
                    }
                }
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock
                                | std::io::ErrorKind::TimedOut
                                | std::io::ErrorKind::Interrupted
                        ) => {}
                    Err(e) => panic!("the slow client's read: {e}"),
                }
                assert!(opened.elapsed() < BOUND, "no answer to the slow client");
            }
            (
                opened,
                Instant::now(),
                sent,
                read_reply(&mut &got[..], false),
            )
        }));
    }
    for _ in 0..5 {
        started.recv().unwrap();
    }
    // While five heads trickle in, others are served.
    for _ in 0..3 {
        serves(&w, &host);
    }
    let served = Instant::now();
    for t in slow {
        let (opened, answered, sent, r) = t.join().unwrap();
        assert!(r.refused(408, "head-timeout"), "{r:?}");
        assert!(answered - opened >= limit, "cut off before the limit");
        assert!(served < answered, "others waited for the slow client");
        assert!(sent < request.len());
    }
    serves(&w, &host);
    assert_eq!(w.denied(), denied(&[]));
}

#[test]
fn garbage_instead_of_http_is_refused() {
    // The default head time (10 s): a refusal here is the proxy telling garbage from a slow head.
    let (host, _dns, w) = allowed(Limits::default());
    let started = Instant::now();
    let cases: [&[u8]; 10] = [
        // A TLS ClientHello sent to the proxy itself (https:// in a proxy URL): no blank line ever.
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\x8a\x11\x00\x00",
        b"\x00\x00\x00\x00\r\n\r\n",
        b"hello\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n",
        // Origin-form: a request for the proxy itself, not through it.
        b"GET /v1/models HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        b"CONNECT allowed.test HTTP/1.1\r\n\r\n",
        b"CONNECT allowed.test:443 HTTP/9.9\r\n\r\n",
        b"CONNECT allowed.test:443 HTTP/1.1\r\nno colon here\r\n\r\n",
        b"CONNECT https://allowed.test:443 HTTP/1.1\r\n\r\n",
        b"GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    ];
    for case in cases {
        let r = ask(&w.socket(), case);
        assert!(
            r.refused(400, "bad-request"),
            "{:?}: {r:?}",
            String::from_utf8_lossy(case)
        );
    }
    assert!(
        started.elapsed() < w.proxy.limits().head_timeout,
        "garbage was waited for"
    );
    serves(&w, &host);
    assert_eq!(w.denied(), denied(&[]));
}

/// Opens `n` tunnels to `allowed.test:443` on `socket` from a few threads at once.
fn open_tunnels(socket: &Path, n: usize) -> Vec<UnixStream> {
    let threads = 8;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let socket = socket.to_owned();
            let count = n / threads + usize::from(t < n % threads);
            std::thread::spawn(move || {
                (0..count)
                    .map(|_| tunnel(&socket, "allowed.test:443").0)
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect()
}

/// Each stream echoes a message of its own.
fn all_pass_data(streams: &mut [UnixStream]) {
    for (i, s) in streams.iter_mut().enumerate() {
        writeln!(s, "message {i}").unwrap();
    }
    for (i, s) in streams.iter_mut().enumerate() {
        let want = format!("message {i}\n");
        let mut got = vec![0u8; want.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(String::from_utf8(got).unwrap(), want);
    }
}

#[test]
fn a_thousand_tunnels_at_once_and_the_proxy_serves_on() {
    raise_open_files();
    let (host, _dns, w) = allowed(Limits::default());
    let jobs = ["job-a", "job-b", "job-c", "job-d"];
    let mut tunnels = Vec::new();
    let handles: Vec<_> = jobs
        .iter()
        .map(|job| {
            let socket = w.open(job);
            std::thread::spawn(move || open_tunnels(&socket, 250))
        })
        .collect();
    for h in handles {
        tunnels.extend(h.join().unwrap());
    }
    assert_eq!(tunnels.len(), 1000);
    assert_eq!(w.proxy.connections(), 1000);
    all_pass_data(&mut tunnels);
    // A new request, of a job with none open and of one with 250.
    serves(&w, &host);
    let (mut s, _) = tunnel(&w.socket_of("job-a"), "allowed.test:443");
    all_pass_data(std::slice::from_mut(&mut s));
    drop(s);
    drop(tunnels);
    wait_until("every tunnel closed", || w.proxy.connections() == 0);
    for job in jobs {
        assert_eq!(w.denied_of(job), denied(&[]));
    }
}

#[test]
fn past_a_jobs_bound_and_the_proxys_the_answer_is_429_and_503_while_others_are_served() {
    let (host, _dns, w) = allowed(Limits {
        per_job: 4,
        total: 6,
        ..Limits::default()
    });
    let a = w.open("job-a");
    let b = w.open("job-b");
    let mut of_a = open_tunnels(&a, 4);
    // Past its bound, job a is refused; its refused connections, still open, take no place of
    // another job's.
    let mut refused = Vec::new();
    for _ in 0..3 {
        let mut s = UnixStream::connect(&a).unwrap();
        s.set_read_timeout(Some(BOUND)).unwrap();
        s.write_all(b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n")
            .unwrap();
        let r = read_reply(&mut s, true);
        assert!(r.refused(429, "too-many-connections-for-job"), "{r:?}");
        refused.push(s);
    }
    let mut of_b = open_tunnels(&b, 2);
    drop(refused);
    // Now the proxy is full: another job is refused, and job a still past its own bound first.
    // Each refusal comes before the proxy read anything: the client's request, sent meanwhile,
    // must not make the answer a reset (as it did, a time in four, before the proxy read on).
    // (A refused connection still open counts for its job: each round asks for fresh jobs, so
    // that those still being let go cannot bring a job to its own bound.)
    for round in 0..10 {
        let fresh = [
            w.open(&format!("job-b{round}")),
            w.open(&format!("job-c{round}")),
        ];
        for (socket, status, code) in [
            (&fresh[0], 503, "too-many-connections"),
            (&fresh[1], 503, "too-many-connections"),
            (&a, 429, "too-many-connections-for-job"),
        ] {
            let r = ask(socket, b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n");
            assert!(r.refused(status, code), "{r:?}");
            // A client slower to send: the answer read first, its request still taken after.
            let mut s = UnixStream::connect(socket).unwrap();
            s.set_read_timeout(Some(BOUND)).unwrap();
            let r = read_reply(&mut s, false);
            assert!(r.refused(status, code), "{r:?}");
            s.write_all(b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n")
                .expect("the proxy still reads after its answer");
        }
    }
    // The tunnels open carry on.
    all_pass_data(&mut of_a);
    all_pass_data(&mut of_b);
    // One closed, one more is served.
    drop(of_b.pop());
    wait_until("the tunnel closed", || w.proxy.connections() == 5);
    serves(&w, &host);
    drop(of_a.pop());
    wait_until("the tunnels closed", || w.proxy.connections() == 4);
    let (mut again, _) = tunnel(&a, "allowed.test:443");
    all_pass_data(std::slice::from_mut(&mut again));
    assert_eq!(w.denied_of(JOB), denied(&[]));
}

#[test]
fn a_tunnel_idle_past_its_time_is_closed() {
    let idle = Duration::from_secs(1);
    let (host, _dns, w) = allowed(Limits {
        idle_timeout: idle,
        ..Limits::default()
    });
    let (mut s, hello) = tunnel(&w.socket(), "allowed.test:443");
    assert_eq!(hello, greeting("allowed", IpAddr::V4(host.v4)));
    // The proxy's idle clock starts at the last bytes it carries, which is after this instant and
    // before the client has read them: taken after the data, a busy machine could make the quiet
    // look shorter than the proxy's.
    let quiet = Instant::now();
    all_pass_data(std::slice::from_mut(&mut s));
    let mut buf = [0u8; 16];
    // The proxy ends it: the read sees the end, not a timeout of its own.
    let n = loop {
        match s.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => break other.unwrap(),
        }
    };
    assert_eq!(n, 0);
    assert!(quiet.elapsed() >= idle, "closed before it was idle long");
    wait_until("the proxy let the tunnel go", || w.proxy.connections() == 0);
    serves(&w, &host);
}

/// Sends `marker` on a new connection to `socket` with `fds` attached, as a job that talks to its
/// socket itself could, and reads the answer.
fn hand_over(socket: &Path, marker: u8, fds: &[std::os::fd::BorrowedFd<'_>]) -> support::Reply {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    rustix::net::sendmsg(
        &s,
        &[std::io::IoSlice::new(&[marker])],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .unwrap();
    read_reply(&mut s, false)
}

#[test]
fn a_job_that_hands_over_what_is_not_a_connection_is_refused_and_the_proxy_serves_on() {
    use std::os::fd::AsFd;
    let (host, _dns, w) = allowed(Limits::default());
    // The control: the runner's forwarder, on a loopback port, hands each connection over.
    let forward =
        w.rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
    let port = forward.local_addr().unwrap().port();
    w.rt.spawn(egress::forward::serve(forward, w.socket()));
    let through_forwarder = |authority: &str| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(BOUND)).unwrap();
        write!(
            s,
            "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
        )
        .unwrap();
        read_reply(&mut s, true)
    };
    let r = through_forwarder("allowed.test:443");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, greeting("allowed", IpAddr::V4(host.v4)));
    // A handed-over connection is the job's whose socket it came through: refused as any.
    let r = through_forwarder("other.test:443");
    assert!(r.refused(403, "not-allowed"), "{r:?}");
    assert_eq!(w.denied(), denied(&[("other.test", 443, 1, "not-allowed")]));

    // What a job can attach instead of a connection.
    let listening = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (pipe, _pipe_w) = rustix::pipe::pipe().unwrap();
    let file = std::fs::File::open("/proc/self/status").unwrap();
    let (unix, _peer) = UnixStream::pair().unwrap();
    let unconnected = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::STREAM,
        None,
    )
    .unwrap();
    let client = std::net::TcpStream::connect(listening.local_addr().unwrap()).unwrap();
    let (accepted, _) = listening.accept().unwrap();
    let hostile: Vec<(&str, u8, Vec<std::os::fd::BorrowedFd<'_>>)> = vec![
        ("a listening socket", 1, vec![listening.as_fd()]),
        ("a pipe", 1, vec![pipe.as_fd()]),
        ("a file", 2, vec![file.as_fd()]),
        ("a unix socket", 1, vec![unix.as_fd()]),
        ("an unconnected socket", 1, vec![unconnected.as_fd()]),
        (
            "two connections",
            1,
            vec![accepted.as_fd(), accepted.as_fd()],
        ),
        ("an unknown marker", 9, vec![accepted.as_fd()]),
    ];
    for (what, marker, fds) in &hostile {
        let r = hand_over(&w.socket(), *marker, fds);
        assert!(r.refused(400, "bad-handover"), "{what}: {r:?}");
    }
    // A connected one, sent the same way, is taken: its request is read from it.
    let r = hand_over(&w.socket(), 1, &[accepted.as_fd()]);
    assert_eq!(r.status, 0, "the socket is not answered: {r:?}");
    let mut client = client;
    client.set_read_timeout(Some(BOUND)).unwrap();
    client
        .write_all(b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n")
        .unwrap();
    let r = read_reply(&mut client, true);
    assert_eq!(r.status, 200, "{r:?}");

    serves(&w, &host);
}
