//! Thin doors to the proxy's private readers for the fuzz targets: the request head read from a
//! client fed from memory, the request it is, and the handover marker.

use std::future::Future as _;
use std::io;
use std::os::fd::BorrowedFd;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, ReadBuf};

pub use crate::handover::Received;
use crate::proxy::{self, HeadError, Kind};
use crate::rules::Target;

/// How much of a head the proxy reads at a time: it never holds more than its limit and this.
pub const HEAD_CHUNK: usize = proxy::HEAD_CHUNK;

/// What the proxy made of what a client sent.
#[derive(Debug, PartialEq, Eq)]
pub enum HeadRead {
    TooLarge,
    Malformed,
    Closed,
    /// A head ending at `len`, in a buffer of `buffered` bytes, with the request it is, if any.
    Head {
        len: usize,
        buffered: usize,
        request: Option<Request>,
    },
}

/// The request a head is: a tunnel's target, or a plain request's target and its head as the
/// proxy sends it on.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    Connect(Target),
    Plain(Target, Vec<u8>),
}

/// A client that sends `data` in pieces of the sizes `pieces` gives (cycled; 0 counts as 1), and
/// counts what it handed over.
struct Client<'a> {
    data: &'a [u8],
    pieces: &'a [usize],
    turn: usize,
    delivered: usize,
}

impl AsyncRead for Client<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let piece = self
            .pieces
            .get(self.turn % self.pieces.len().max(1))
            .copied()
            .unwrap_or(usize::MAX)
            .max(1);
        let n = piece.min(buf.remaining()).min(self.data.len());
        buf.put_slice(&self.data[..n]);
        self.data = &self.data[n..];
        self.turn += 1;
        self.delivered += n;
        Poll::Ready(Ok(()))
    }
}

/// Reads a head of at most `max` bytes from a client sending `data` in `pieces`, as the proxy
/// does; also how many bytes the client handed over.
pub fn read_head(data: &[u8], pieces: &[usize], max: usize) -> (HeadRead, usize) {
    let mut client = Client {
        data,
        pieces,
        turn: 0,
        delivered: 0,
    };
    let read = {
        let mut future = pin!(proxy::read_head(&mut client, max));
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(read) => read,
            // A client in memory is always ready: waiting on it is a bug of the reader.
            Poll::Pending => Err(HeadError::Closed),
        }
    };
    let read = match read {
        Err(HeadError::TooLarge) => HeadRead::TooLarge,
        Err(HeadError::Malformed) => HeadRead::Malformed,
        Err(HeadError::Closed) => HeadRead::Closed,
        Ok(head) => HeadRead::Head {
            len: head.len,
            buffered: head.bytes.len(),
            request: parse_request(&head.bytes[..head.len]),
        },
    };
    (read, client.delivered)
}

/// The request a whole head is, as the proxy reads it.
pub fn parse_request(head: &[u8]) -> Option<Request> {
    proxy::parse_request(head).map(|r| match r.kind {
        Kind::Connect(target) => Request::Connect(target),
        Kind::Plain(target, head) => Request::Plain(target, head),
    })
}

/// The first byte of a connection to a job's socket and what came with it, read now.
pub fn handover(socket: BorrowedFd<'_>) -> io::Result<Received> {
    crate::handover::receive_now(socket)
}
