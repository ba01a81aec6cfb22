//! A nameserver on loopback for the egress proxy's tests: it answers A and AAAA questions from a
//! table the test sets, where a name may have a list of answers given in turn (the last one
//! repeated), as a rebinding attacker's server does, and counts the questions it was asked. Turns
//! and counts are kept apart for each record type: the first A question and the first AAAA question
//! both get the first answer.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};

/// A record type the nameserver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Record {
    A,
    Aaaa,
}

impl Record {
    fn qtype(self) -> u16 {
        match self {
            Record::A => 1,
            Record::Aaaa => 28,
        }
    }
}

#[derive(Default)]
struct Table {
    answers: HashMap<String, Vec<Vec<IpAddr>>>,
    /// Questions by name and query type.
    asked: HashMap<(String, u16), usize>,
}

/// The nameserver; it stops when dropped.
pub struct FakeDns {
    pub addr: SocketAddr,
    table: Arc<Mutex<Table>>,
    socket: UdpSocket,
}

impl FakeDns {
    pub fn start() -> FakeDns {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let table = Arc::new(Mutex::new(Table::default()));
        let (s, t) = (socket.try_clone().unwrap(), table.clone());
        std::thread::spawn(move || serve(s, t));
        FakeDns {
            addr,
            table,
            socket,
        }
    }

    /// `name` answers `addrs` (A and AAAA records from the same list).
    pub fn set(&self, name: &str, addrs: &[IpAddr]) {
        self.set_turns(name, &[addrs]);
    }

    /// `name` answers each list in turn, one a question of each record type, then the last again
    /// and again.
    pub fn set_turns(&self, name: &str, turns: &[&[IpAddr]]) {
        let mut t = self.table.lock().unwrap();
        t.answers
            .insert(name.to_owned(), turns.iter().map(|a| a.to_vec()).collect());
        t.asked.retain(|(n, _), _| n != name);
    }

    /// How many questions of any type were asked about `name`.
    pub fn asked(&self, name: &str) -> usize {
        let t = self.table.lock().unwrap();
        t.asked
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|(_, count)| count)
            .sum()
    }

    /// How many questions for `record` were asked about `name`.
    pub fn asked_for(&self, name: &str, record: Record) -> usize {
        let t = self.table.lock().unwrap();
        t.asked
            .get(&(name.to_owned(), record.qtype()))
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for FakeDns {
    fn drop(&mut self) {
        // A zero-length datagram to itself ends the serving thread.
        let _ = self.socket.send_to(&[], self.addr);
    }
}

fn serve(socket: UdpSocket, table: Arc<Mutex<Table>>) {
    let mut buf = [0u8; 1500];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            return;
        };
        if n == 0 {
            return;
        }
        if let Some(reply) = reply(&buf[..n], &table) {
            let _ = socket.send_to(&reply, from);
        }
    }
}

fn reply(q: &[u8], table: &Mutex<Table>) -> Option<Vec<u8>> {
    if q.len() < 12 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*q.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(q.get(at..at + len)?).to_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*q.get(at)?, *q.get(at + 1)?]);
    let question_end = at + 4;
    let name = labels.join(".");
    let addrs: Vec<IpAddr> = {
        let mut t = table.lock().unwrap();
        let turn = {
            let asked = t.asked.entry((name.clone(), qtype)).or_insert(0);
            *asked += 1;
            *asked
        };
        match t.answers.get(&name) {
            Some(turns) => turns[(turn - 1).min(turns.len() - 1)].clone(),
            None => Vec::new(),
        }
    };
    let records: Vec<&IpAddr> = addrs
        .iter()
        .filter(|a| matches!((a, qtype), (IpAddr::V4(_), 1) | (IpAddr::V6(_), 28)))
        .collect();
    let mut r = q[..question_end].to_vec();
    r[2] = 0x81; // a response, recursion desired
    r[3] = if addrs.is_empty() { 0x83 } else { 0x80 }; // NXDOMAIN when the name is unknown
    r[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
    r[8..12].fill(0);
    for a in records {
        r.extend_from_slice(&[0xc0, 12]);
        r.extend_from_slice(&qtype.to_be_bytes());
        r.extend_from_slice(&[0, 1, 0, 0, 0, 0]); // class IN, TTL 0
        match a {
            IpAddr::V4(v4) => {
                r.extend_from_slice(&[0, 4]);
                r.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                r.extend_from_slice(&[0, 16]);
                r.extend_from_slice(&v6.octets());
            }
        }
    }
    Some(r)
}
