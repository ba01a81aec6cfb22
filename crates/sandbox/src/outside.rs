//! Egress off: the job's own network namespace, with user-mode networking to the outside and no
//! way back to the host.
//!
//! The worker (root) makes the namespace on a thread of its own, so it belongs to the host's user
//! namespace and nothing in the job (which holds capabilities only in user namespaces of its own)
//! can change it. Before anything else is in it, a `prohibit` route is put in for each of the
//! host's own IPv4 addresses and for link-local addresses (a cloud's metadata service among them).
//! Then `slirp4netns` attaches to it: a process on the host that gives the namespace a `tap0`
//! device, an address and a default route, and carries what the job sends out as ordinary sockets
//! of the host, with the host's loopback refused (`--disable-host-loopback`), in a mount namespace
//! of its own with its capabilities dropped and a system-call filter (`--enable-sandbox
//! --enable-seccomp`), in the job's control groups, with its resolver address off
//! (`--disable-dns`): that address would carry any port to the host's nameserver, which may be a
//! stub on the host's loopback. It starts in a mount namespace whose mounts
//! are all slaves of the host's: its sandbox unmounts its copy of the host's tree, which, as root
//! in the host's user namespace, would otherwise unmount the host's own mounts where they are
//! shared (a network namespace's file under `/run/netns`, a job's overlay under a shared `/var`). The job's resolver is slirp4netns's
//! the host's nameservers, asked through slirp4netns like any other address ([`resolver_conf`]).
//!
//! What the job reaches: any address but the host's own, over IPv4 (slirp4netns's IPv6 is off).
//! Not the host's loopback (its own loopback is its own), not the host's addresses, not another
//! job (each has its own namespace, and its gateway listens on that namespace's loopback).
//! Addresses the host gains after the job started are not refused to it.
//!
//! Both backends run the job in this namespace: bubblewrap joins it before it starts, Podman is
//! given it as `--network ns:PATH`.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use command_fds::{CommandFdExt as _, FdMapping};

pub use protocol::egress::SLIRP4NETNS;
/// The host's resolver configuration, and where systemd-resolved keeps the servers it asks when
/// the host's names its own stub on loopback.
pub const HOST_RESOLVER: &str = "/etc/resolv.conf";
pub const RESOLVED_UPSTREAM: &str = "/run/systemd/resolve/resolv.conf";
/// Link-local addresses (IPv4), refused to every job: where clouds serve instance credentials.
pub const LINK_LOCAL: (Ipv4Addr, u8) = (Ipv4Addr::new(169, 254, 0, 0), 16);
/// How long slirp4netns may take to say the network is up.
const READY_WITHIN: Duration = Duration::from_secs(10);
/// The MTU of the job's device (slirp4netns's largest; the loopback-like speed it allows).
const MTU: &str = "65520";

/// Its descriptors in slirp4netns.
const NETNS_FD: i32 = 3;
const READY_FD: i32 = 4;
const EXIT_FD: i32 = 5;

/// A job's network, up; dropped, slirp4netns ends and the namespace goes with the last process
/// in it.
#[derive(Debug)]
pub struct Outside {
    netns: OwnedFd,
    slirp: Child,
    /// slirp4netns ends when this closes.
    _exit: OwnedFd,
}

/// Why a job's network could not be made (no value of the job in it).
#[derive(Debug, thiserror::Error)]
pub enum OutsideError {
    #[error("the job's network namespace cannot be made ({0})")]
    Namespace(io::ErrorKind),
    #[error("a route refusing the host's addresses cannot be put in the job's network ({0})")]
    Route(io::ErrorKind),
    #[error("slirp4netns cannot be started ({0}); install Debian's slirp4netns")]
    Start(io::ErrorKind),
    #[error("slirp4netns did not bring the job's network up")]
    NotUp,
}

/// The networks refused to a job: each of the host's own IPv4 addresses but loopback (the job's
/// loopback is its own) and the link-local ones, as (network, prefix length). Pure.
pub fn refused(host: &[IpAddr]) -> Vec<(Ipv4Addr, u8)> {
    let mut nets: Vec<(Ipv4Addr, u8)> = host
        .iter()
        .filter_map(|a| match a {
            IpAddr::V4(v4) if !v4.is_loopback() && !v4.is_unspecified() => Some((*v4, 32)),
            _ => None,
        })
        .collect();
    nets.push(LINK_LOCAL);
    nets.sort();
    nets.dedup();
    nets
}

/// The nameservers a job with egress off asks, from a resolver configuration's text: its IPv4
/// `nameserver` lines, but those on loopback (a stub of the host's, out of the job's reach).
/// Pure.
pub fn nameservers(conf: &str) -> Vec<Ipv4Addr> {
    conf.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver")).then(|| words.next())?
        })
        .filter_map(|a| a.parse::<Ipv4Addr>().ok())
        .filter(|a| !a.is_loopback() && !a.is_unspecified())
        .collect()
}

/// The job's resolver configuration: the host's nameservers ([`nameservers`] of
/// [`HOST_RESOLVER`], else of [`RESOLVED_UPSTREAM`] when the host asks a stub of its own), each
/// reached through slirp4netns like any address; empty when the host has none a job can reach.
pub fn resolver_conf() -> String {
    let read = |path: &str| nameservers(&std::fs::read_to_string(path).unwrap_or_default());
    let mut servers = read(HOST_RESOLVER);
    if servers.is_empty() {
        servers = read(RESOLVED_UPSTREAM);
    }
    servers
        .iter()
        .map(|a| format!("nameserver {a}\n"))
        .collect()
}

/// The host's own addresses, as its interfaces have them now.
pub fn host_addresses() -> io::Result<Vec<IpAddr>> {
    let addresses = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
    Ok(addresses
        .filter_map(|a| a.address)
        .filter_map(|a| {
            a.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .collect())
}

/// slirp4netns's command line. Pure.
pub fn slirp_args() -> Vec<String> {
    [
        "--configure".to_owned(),
        format!("--mtu={MTU}"),
        "--disable-host-loopback".to_owned(),
        // Its resolver address would carry any port to the host's nameserver (systemd-resolved's
        // stub on the host's loopback, say): the job asks the host's servers itself instead.
        "--disable-dns".to_owned(),
        "--enable-sandbox".to_owned(),
        "--enable-seccomp".to_owned(),
        "--netns-type=path".to_owned(),
        format!("--ready-fd={READY_FD}"),
        format!("--exit-fd={EXIT_FD}"),
        format!("/proc/self/fd/{NETNS_FD}"),
        "tap0".to_owned(),
    ]
    .into()
}

impl Outside {
    /// Makes the job's network: its namespace with the host's addresses refused, then slirp4netns
    /// (at `slirp`) attached, in the control groups whose `cgroup.procs` files are `join`, up.
    /// Needs root.
    pub fn start(slirp: &Path, join: &[PathBuf]) -> Result<Outside, OutsideError> {
        let refused = refused(&host_addresses().map_err(|e| OutsideError::Namespace(e.kind()))?);
        let netns = std::thread::scope(|s| {
            s.spawn(|| -> Result<OwnedFd, OutsideError> {
                sys::unshare_network().map_err(|e| OutsideError::Namespace(e.kind()))?;
                let ns = std::fs::File::open("/proc/thread-self/ns/net")
                    .map_err(|e| OutsideError::Namespace(e.kind()))?;
                prohibit(&refused).map_err(|e| OutsideError::Route(e.kind()))?;
                Ok(ns.into())
            })
            .join()
            .unwrap_or(Err(OutsideError::Namespace(io::ErrorKind::Other)))
        })?;
        let (ready_read, ready_write) = io::pipe().map_err(|e| OutsideError::Start(e.kind()))?;
        let (exit_read, exit_write) = io::pipe().map_err(|e| OutsideError::Start(e.kind()))?;
        let mut command = Command::new(slirp);
        // Its sandbox unmounts its copy of the host's tree: in a namespace of slaves, so that no
        // unmount reaches the host's shared mounts.
        sys::own_mounts_on_exec(&mut command);
        command
            .args(slirp_args())
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let netns_copy = netns
            .try_clone()
            .map_err(|e| OutsideError::Start(e.kind()))?;
        command
            .fd_mappings(vec![
                FdMapping {
                    parent_fd: netns_copy,
                    child_fd: NETNS_FD,
                },
                FdMapping {
                    parent_fd: ready_write.into(),
                    child_fd: READY_FD,
                },
                FdMapping {
                    parent_fd: exit_read.into(),
                    child_fd: EXIT_FD,
                },
            ])
            .map_err(|_| OutsideError::Start(io::ErrorKind::Other))?;
        let mut slirp = command.spawn().map_err(|e| OutsideError::Start(e.kind()))?;
        // Our copies of its ends close here: a slirp4netns that dies closes the ready pipe.
        drop(command);
        for file in join {
            // Bounded as the job is (a group that cannot be joined is the job's bound missing,
            // which the job's own start finds).
            let _ = std::fs::write(file, slirp.id().to_string());
        }
        if !up(ready_read.as_fd()) {
            let _ = slirp.kill();
            let _ = slirp.wait();
            return Err(OutsideError::NotUp);
        }
        Ok(Outside {
            netns,
            slirp,
            _exit: exit_write.into(),
        })
    }

    /// The namespace, for the backend to start the job in.
    pub fn netns(&self) -> BorrowedFd<'_> {
        self.netns.as_fd()
    }

    /// slirp4netns's process id.
    pub fn slirp_pid(&self) -> u32 {
        self.slirp.id()
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = self.slirp.kill();
        let _ = self.slirp.wait();
    }
}

/// Whether slirp4netns wrote on its ready descriptor within [`READY_WITHIN`] (it writes `1` once
/// the device, its address and the default route are in place).
fn up(ready: BorrowedFd<'_>) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let timeout = Timespec::try_from(left).unwrap_or(Timespec {
            tv_sec: 10,
            tv_nsec: 0,
        });
        let mut fds = [PollFd::new(&ready, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => return false,
            Ok(_) => {
                let mut byte = [0u8; 1];
                return matches!(rustix::io::read(ready, &mut byte), Ok(1));
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
}

/// A `prohibit` route for each of `nets`, in the calling thread's network namespace (through a
/// netlink socket made there): a packet for one is refused in the namespace and never reaches
/// slirp4netns.
fn prohibit(nets: &[(Ipv4Addr, u8)]) -> io::Result<()> {
    use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketType, netlink};
    let socket = rustix::net::socket(AddressFamily::NETLINK, SocketType::RAW, None)?;
    let kernel = netlink::SocketAddrNetlink::new(0, 0);
    for (seq, (net, len)) in (1u32..).zip(nets) {
        let message = route_message(seq, *net, *len);
        rustix::net::sendto(&socket, &message, SendFlags::empty(), &kernel)?;
        let mut answer = [0u8; 512];
        let (n, _) = rustix::net::recv(&socket, &mut answer[..], RecvFlags::empty())?;
        ack(&answer[..n.min(answer.len())])?;
    }
    Ok(())
}

/// `RTM_NEWROUTE` for a `prohibit` route to `net`/`len` in the main table, asking for an answer.
/// Pure.
pub fn route_message(seq: u32, net: Ipv4Addr, len: u8) -> Vec<u8> {
    const NLMSG_HDRLEN: usize = 16;
    const RTMSG_LEN: usize = 12;
    const RTA_LEN: usize = 4 + 4;
    let total = NLMSG_HDRLEN + RTMSG_LEN + RTA_LEN;
    let flags =
        (libc::NLM_F_REQUEST | libc::NLM_F_ACK | libc::NLM_F_CREATE | libc::NLM_F_EXCL) as u16;
    let mut m = Vec::with_capacity(total);
    // struct nlmsghdr
    m.extend_from_slice(&(total as u32).to_ne_bytes());
    m.extend_from_slice(&libc::RTM_NEWROUTE.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // struct rtmsg
    m.extend_from_slice(&[
        rustix::net::AddressFamily::INET.as_raw() as u8,
        len,
        0, // src_len
        0, // tos
        libc::RT_TABLE_MAIN,
        libc::RTPROT_STATIC,
        libc::RT_SCOPE_UNIVERSE,
        libc::RTN_PROHIBIT,
    ]);
    m.extend_from_slice(&0u32.to_ne_bytes());
    // struct rtattr RTA_DST, then the address
    m.extend_from_slice(&(RTA_LEN as u16).to_ne_bytes());
    m.extend_from_slice(&libc::RTA_DST.to_ne_bytes());
    m.extend_from_slice(&net.octets());
    m
}

/// The kernel's answer to one request: `NLMSG_ERROR` with error 0 is success. Pure.
pub fn ack(answer: &[u8]) -> io::Result<()> {
    let word = |at: usize| -> Option<[u8; 4]> { answer.get(at..at + 4)?.try_into().ok() };
    let kind = answer
        .get(4..6)
        .and_then(|b| b.try_into().ok())
        .map(u16::from_ne_bytes);
    match (kind, word(16).map(i32::from_ne_bytes)) {
        (Some(k), Some(0)) if k == libc::NLMSG_ERROR as u16 => Ok(()),
        (Some(k), Some(e)) if k == libc::NLMSG_ERROR as u16 => {
            Err(io::Error::from_raw_os_error(-e))
        }
        _ => Err(io::Error::other("netlink answered something else")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_own_addresses_and_link_local_are_refused_loopback_is_the_jobs() {
        let host: Vec<IpAddr> = [
            "127.0.0.1",
            "192.0.2.2",
            "10.88.0.1",
            "::1",
            "fd00::1",
            "192.0.2.2",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        assert_eq!(
            refused(&host),
            vec![
                (Ipv4Addr::new(10, 88, 0, 1), 32),
                (Ipv4Addr::new(169, 254, 0, 0), 16),
                (Ipv4Addr::new(192, 0, 2, 2), 32),
            ]
        );
    }

    #[test]
    fn a_prohibit_route_as_the_kernel_reads_it() {
        let m = route_message(7, Ipv4Addr::new(192, 0, 2, 2), 32);
        assert_eq!(m.len(), 36);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 36);
        assert_eq!(
            u16::from_ne_bytes(m[4..6].try_into().unwrap()),
            libc::RTM_NEWROUTE
        );
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
        // family, prefix length, table, type
        assert_eq!(
            (m[16], m[17], m[20], m[23]),
            (2, 32, 254, libc::RTN_PROHIBIT)
        );
        assert_eq!(&m[32..36], &[192, 0, 2, 2]);
    }

    #[test]
    fn the_kernels_answer_is_read() {
        let mut ok = vec![0u8; 36];
        ok[4..6].copy_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        assert!(ack(&ok).is_ok());
        let mut exists = ok.clone();
        let eexist = rustix::io::Errno::EXIST.raw_os_error();
        exists[16..20].copy_from_slice(&(-eexist).to_ne_bytes());
        assert_eq!(ack(&exists).unwrap_err().raw_os_error(), Some(eexist));
        assert!(ack(&[1, 2, 3]).is_err());
    }

    #[test]
    fn a_job_asks_the_hosts_nameservers_never_one_on_loopback() {
        let conf = "# stub\nnameserver 127.0.0.53\noptions edns0\nnameserver 192.0.2.53\nnameserver  198.51.100.7 \nnameserver 2001:db8::53\nnameserver 0.0.0.0\nsearch example.net\n";
        assert_eq!(
            nameservers(conf),
            vec![Ipv4Addr::new(192, 0, 2, 53), Ipv4Addr::new(198, 51, 100, 7)]
        );
        assert!(nameservers("nameserver 127.0.0.53\n").is_empty());
    }

    #[test]
    fn slirp4netns_refuses_the_hosts_loopback_in_a_sandbox_of_its_own() {
        let a = slirp_args().join(" ");
        for part in [
            "--disable-dns",
            "--disable-host-loopback",
            "--enable-sandbox",
            "--enable-seccomp",
            "--configure",
        ] {
            assert!(a.contains(part), "{a}");
        }
        assert!(a.ends_with("/proc/self/fd/3 tap0"), "{a}");
    }
}
