//! How the proxy turns a name into addresses, once per request: the system's resolver
//! (`getaddrinfo`, so `/etc/hosts` and `/etc/resolv.conf`), or one nameserver the operator names
//! (`PI_EGRESS_NAMESERVER`), asked over UDP for A and AAAA records with no cache of its own.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::UdpSocket;

/// How long one lookup may take.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolver {
    System,
    Nameserver(SocketAddr),
}

impl Resolver {
    /// The addresses of `name`, in the order they came; empty when it does not resolve.
    pub async fn lookup(&self, name: &str) -> Vec<IpAddr> {
        let found = tokio::time::timeout(LOOKUP_TIMEOUT, async {
            match self {
                Resolver::System => match tokio::net::lookup_host((name, 0)).await {
                    Ok(addrs) => addrs.map(|a| a.ip()).collect(),
                    Err(_) => Vec::new(),
                },
                Resolver::Nameserver(server) => {
                    let (v4, v6) =
                        tokio::join!(ask(*server, name, TYPE_A), ask(*server, name, TYPE_AAAA));
                    v4.into_iter().chain(v6).collect()
                }
            }
        })
        .await;
        found.unwrap_or_default()
    }
}

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;

/// One question to `server`; the addresses of the records of `qtype` in the answer.
async fn ask(server: SocketAddr, name: &str, qtype: u16) -> Vec<IpAddr> {
    let Some((id, query)) = query(name, qtype) else {
        return Vec::new();
    };
    let bind: SocketAddr = if server.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let Ok(socket) = UdpSocket::bind(bind).await else {
        return Vec::new();
    };
    if socket.connect(server).await.is_err() || socket.send(&query).await.is_err() {
        return Vec::new();
    }
    let mut buf = [0u8; 1500];
    loop {
        let Ok(n) = socket.recv(&mut buf).await else {
            return Vec::new();
        };
        // An answer to another question (a late one, or a forgery) is not this one's.
        if let Some(addrs) = answer(&buf[..n], id, qtype) {
            return addrs;
        }
    }
}

/// A DNS query for `name` (`None` for a name DNS cannot carry) and its id.
pub fn query(name: &str, qtype: u16) -> Option<(u16, Vec<u8>)> {
    // A random id: an answer must echo it.
    let id = u16::from_be_bytes(protocol::ids::random::<2>().ok()?);
    let mut q = Vec::with_capacity(18 + name.len());
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]); // RD; one question
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            return None;
        }
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&CLASS_IN.to_be_bytes());
    Some((id, q))
}

/// The addresses in a DNS answer to query `id` of type `qtype`; `None` when the message is not
/// that answer.
pub fn answer(msg: &[u8], id: u16, qtype: u16) -> Option<Vec<IpAddr>> {
    let header = msg.get(..12)?;
    if u16::from_be_bytes([header[0], header[1]]) != id || header[2] & 0x80 == 0 {
        return None;
    }
    let questions = u16::from_be_bytes([header[4], header[5]]);
    let answers = u16::from_be_bytes([header[6], header[7]]);
    let mut at = 12;
    for _ in 0..questions {
        at = skip_name(msg, at)? + 4;
    }
    let mut out = Vec::new();
    for _ in 0..answers {
        at = skip_name(msg, at)?;
        let fixed = msg.get(at..at + 10)?;
        let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
        let class = u16::from_be_bytes([fixed[2], fixed[3]]);
        let len = usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
        let data = msg.get(at + 10..at + 10 + len)?;
        at += 10 + len;
        if class != CLASS_IN || rtype != qtype {
            continue; // a CNAME on the way, say: the addresses follow it
        }
        match (rtype, data.len()) {
            (TYPE_A, 4) => out.push(IpAddr::from([data[0], data[1], data[2], data[3]])),
            (TYPE_AAAA, 16) => {
                let mut b = [0u8; 16];
                b.copy_from_slice(data);
                out.push(IpAddr::from(b));
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The offset after the name at `at` (labels, or a compression pointer).
fn skip_name(msg: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *msg.get(at)?;
        match len {
            0 => return Some(at + 1),
            l if l & 0xc0 == 0xc0 => {
                msg.get(at + 1)?;
                return Some(at + 2);
            }
            l if l & 0xc0 == 0 => at += 1 + usize::from(l),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_and_its_answer() {
        let (id, q) = query("api.example.com", TYPE_A).unwrap();
        assert_eq!(&q[12..], b"\x03api\x07example\x03com\x00\x00\x01\x00\x01");
        let mut msg = q.clone();
        msg[2] |= 0x80; // a response
        msg[7] = 2; // two answers
        // A CNAME (skipped), then an A record, both named by a pointer to the question.
        msg.extend_from_slice(&[0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 0, 0, 2, 0xc0, 12]);
        msg.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 10, 0, 0, 7]);
        assert_eq!(
            answer(&msg, id, TYPE_A),
            Some(vec![IpAddr::from([10, 0, 0, 7])])
        );
        assert_eq!(answer(&msg, id.wrapping_add(1), TYPE_A), None);
        assert_eq!(answer(&msg[..msg.len() - 2], id, TYPE_A), None);
        assert_eq!(query("a..b", TYPE_A), None);
    }
}
