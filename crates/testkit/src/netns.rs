//! Test hosts: network namespaces the test makes itself (`ip netns`, a veth pair to this one), so
//! that traffic that must leave the machine goes to a peer the test owns and nowhere else. Each
//! host has an IPv4 and an IPv6 address on its own /30 and /64; this namespace has the other end.
//! Sockets are bound inside a host from a thread that enters its namespace, so the test's own
//! servers run in the test process. Needs root (as in CI). Dropped, the host is removed.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, UdpSocket};
use std::process::Command;

/// One test host.
#[derive(Debug)]
pub struct TestHost {
    pub name: String,
    /// The host's addresses.
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
    /// This namespace's end of the link.
    pub gateway_v4: Ipv4Addr,
    pub gateway_v6: Ipv6Addr,
    link: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("ip (iproute2) runs");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ip_quiet(args: &[&str]) {
    let _ = Command::new("ip").args(args).output();
}

/// The lock every test host of this machine is made and removed under: `ip netns add` makes
/// `/run/netns` a mount point of its own the first time, and two made at once can leave a host's
/// file that is no namespace (entering it then fails with EINVAL).
fn locked() -> nix::fcntl::Flock<File> {
    let path = std::env::temp_dir().join("pi-dispatch-testhosts.counter");
    let file = File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .expect("the test hosts' counter opens");
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("the test hosts' counter locks")
}

/// A number no other test host of this machine has now: a counter in the locked file.
fn next_slot(locked: &mut nix::fcntl::Flock<File>) -> u32 {
    let mut text = String::new();
    locked.read_to_string(&mut text).unwrap();
    let n: u32 = text.trim().parse().unwrap_or(0) % 16_000;
    locked.rewind().unwrap();
    locked.set_len(0).unwrap();
    write!(locked, "{}", n + 1).unwrap();
    n
}

impl TestHost {
    /// Makes a new host, linked to this namespace.
    pub fn new() -> TestHost {
        let mut lock = locked();
        let slot = next_slot(&mut lock);
        let name = format!("pdt{slot}");
        let link = format!("pdv{slot}");
        let peer = format!("pdp{slot}");
        // A host left by a test that was killed has this slot's names: take them back.
        ip_quiet(&["netns", "del", &name]);
        ip_quiet(&["link", "del", &link]);
        // A /30 of 10.200.0.0/16 a slot.
        let base = slot * 4;
        let (c, d) = ((base >> 8) as u8, (base & 0xff) as u8);
        let v4 = Ipv4Addr::new(10, 200, c, d + 2);
        let gateway_v4 = Ipv4Addr::new(10, 200, c, d + 1);
        let v6: Ipv6Addr = format!("fd70:7064:{slot:x}::2").parse().unwrap();
        let gateway_v6: Ipv6Addr = format!("fd70:7064:{slot:x}::1").parse().unwrap();
        ip(&["netns", "add", &name]);
        ip(&["link", "add", &link, "type", "veth", "peer", "name", &peer]);
        ip(&["link", "set", &peer, "netns", &name]);
        ip(&["addr", "add", &format!("{gateway_v4}/30"), "dev", &link]);
        ip(&[
            "-6",
            "addr",
            "add",
            &format!("{gateway_v6}/64"),
            "dev",
            &link,
            "nodad",
        ]);
        ip(&["link", "set", &link, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &name, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&["addr", "add", &format!("{v4}/30"), "dev", &peer]);
        inside(&[
            "-6",
            "addr",
            "add",
            &format!("{v6}/64"),
            "dev",
            &peer,
            "nodad",
        ]);
        inside(&["link", "set", &peer, "up"]);
        inside(&["link", "set", "lo", "up"]);
        inside(&["route", "add", "default", "via", &gateway_v4.to_string()]);
        TestHost {
            name,
            v4,
            v6,
            gateway_v4,
            gateway_v6,
            link,
        }
    }

    /// Runs `f` on a thread inside the host's namespace (sockets it makes stay there).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = File::open(&path).expect("the host's namespace opens");
                nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .expect("the thread enters the host's namespace");
                f()
            })
            .join()
            .expect("the thread in the host's namespace did not panic")
        })
    }

    /// A TCP listener on `port` of every address of the host (0: any free port).
    pub fn tcp(&self, port: u16) -> TcpListener {
        self.run(|| TcpListener::bind(("::", port)).expect("a listener binds in the test host"))
    }

    /// A UDP socket on `port` of every address of the host.
    pub fn udp(&self, port: u16) -> UdpSocket {
        self.run(|| UdpSocket::bind(("::", port)).expect("a UDP socket binds in the test host"))
    }
}

impl Default for TestHost {
    fn default() -> Self {
        TestHost::new()
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        let _lock = locked();
        ip_quiet(&["netns", "del", &self.name]);
        ip_quiet(&["link", "del", &self.link]);
    }
}

/// A listener on every address of this host (loopback included), and this host's IPv4 addresses,
/// each proven to reach it from here: what a job must not reach, with its control.
#[derive(Debug)]
pub struct HostListener {
    pub listener: TcpListener,
    pub port: u16,
    pub v4: Vec<std::net::IpAddr>,
}

impl HostListener {
    pub fn new() -> HostListener {
        let listener = TcpListener::bind("0.0.0.0:0").expect("a listener binds on the host");
        let port = listener.local_addr().unwrap().port();
        let v4: Vec<std::net::IpAddr> = nix::ifaddrs::getifaddrs()
            .expect("the host's addresses are read")
            .filter_map(|a| a.address?.as_sockaddr_in().map(|v4| v4.ip().into()))
            .collect();
        // The control: the backlog answers a connect on each address.
        for a in &v4 {
            std::net::TcpStream::connect((*a, port))
                .unwrap_or_else(|e| panic!("the host's listener answers the host at {a}: {e}"));
        }
        HostListener { listener, port, v4 }
    }
}

impl Default for HostListener {
    fn default() -> Self {
        HostListener::new()
    }
}
