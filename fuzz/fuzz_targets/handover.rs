//! The handover marker (crates/egress handover.rs): the first byte of a connection to a job's
//! socket and the descriptors the job sends with it. Each input picks the marker, which
//! descriptors go along (a pipe, a file, a unix socket, a listening TCP socket, either end of a
//! connected TCP connection), how many times, or that the peer closes at once; what is read is
//! held to a model of the rule:
//!
//! - nothing sent: `Closed`; a byte alone: that byte; exactly one connected TCP socket behind a
//!   known marker: handed over with that marker; anything else: refused;
//! - every descriptor that arrived and is not handed over is closed (none leaks).
#![no_main]

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;

use egress::fuzz::{Received, handover};
use egress::handover::{REQUEST_HERE, REQUEST_ON_IT};
use libfuzzer_sys::fuzz_target;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// The most descriptors the proxy reads with the marker (more are cut by the kernel).
const MOST: usize = 4;

struct Fixtures {
    pipe: OwnedFd,
    file: std::fs::File,
    unix: UnixStream,
    listener: TcpListener,
    client: TcpStream,
    accepted: TcpStream,
}

fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let (pipe, _) = rustix::pipe::pipe().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        Fixtures {
            pipe,
            file: std::fs::File::open("/dev/null").unwrap(),
            unix: UnixStream::pair().unwrap().0,
            listener,
            client,
            accepted,
        }
    })
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fuzz_target!(|data: &[u8]| {
    let [marker, mask, times, how, ..] = *data else {
        return;
    };
    let f = fixtures();
    let kinds: [(BorrowedFd<'_>, bool); 6] = [
        (f.pipe.as_fd(), false),
        (f.file.as_fd(), false),
        (f.unix.as_fd(), false),
        (f.listener.as_fd(), false),
        (f.client.as_fd(), true),
        (f.accepted.as_fd(), true),
    ];
    let mut sent: Vec<BorrowedFd<'_>> = Vec::new();
    let mut tcp = false;
    for _ in 0..=(times % 3) {
        for (bit, (fd, connected)) in kinds.iter().enumerate() {
            if mask & (1 << bit) != 0 {
                sent.push(*fd);
                tcp = *connected;
            }
        }
    }
    let closes = how & 1 == 1;
    let before = open_descriptors();
    let (ours, theirs) = UnixStream::pair().unwrap();
    if closes {
        drop(theirs);
    } else {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(18))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !sent.is_empty() {
            assert!(control.push(SendAncillaryMessage::ScmRights(&sent)));
        }
        let n = rustix::net::sendmsg(
            &theirs,
            &[IoSlice::new(&[marker])],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .unwrap();
        assert_eq!(n, 1);
        drop(theirs);
    }
    let received = handover(ours.as_fd()).unwrap();
    let known = [REQUEST_ON_IT, REQUEST_HERE].contains(&marker);
    match &received {
        Received::Closed => assert!(closes),
        Received::Byte(b) => assert!(!closes && sent.is_empty() && *b == marker),
        Received::Handed { marker: m, .. } => {
            assert!(!closes && sent.len() == 1 && tcp && known && *m == marker)
        }
        Received::Refused => assert!(
            !closes && !sent.is_empty() && (sent.len() != 1 || !tcp || !known || sent.len() > MOST)
        ),
    }
    drop(received);
    drop(ours);
    assert_eq!(
        open_descriptors(),
        before,
        "a descriptor the job sent is left open"
    );
});
