//! How the runner hands a job's connection to the proxy instead of carrying it.
//!
//! The forwarder inside the sandbox accepts a job's TCP connection, connects to the job's proxy
//! socket and sends one marker byte with the accepted descriptor attached (`SCM_RIGHTS`). From then
//! on the proxy reads the request from that descriptor and moves the tunnel's bytes between it and
//! the upstream itself: nothing in the sandbox copies them. Who the connection belongs to is still
//! told by the socket it came through, never by anything the job sends.
//!
//! A client that speaks HTTP on the socket itself (the bench, a test) still works: a byte with no
//! descriptor is the first byte of its request.
//!
//! Whatever arrives is the job's, so it is checked before the proxy uses it: a descriptor must be a
//! connected TCP socket (never a listening one, a pipe, a file or a unix socket), at most one comes
//! with the marker, and any other the job sends along is closed unread.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketType,
};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// The attached connection carries the request and then the tunnel (the forwarder's port).
pub const REQUEST_ON_IT: u8 = 0x01;
/// A `CONNECT` head follows on the socket, and is answered there; the attached connection carries
/// only the tunnel's bytes (a declared endpoint on the job's loopback).
pub const REQUEST_HERE: u8 = 0x02;

/// The most descriptors read with the marker; more are closed by the kernel, these by the proxy.
const MOST: usize = 4;

/// What a connection to a job's socket began with.
#[derive(Debug)]
pub enum Received {
    /// Its peer closed before sending anything.
    Closed,
    /// A byte with nothing attached: the first byte of a request on the socket itself.
    Byte(u8),
    /// A handed-over connection and the marker that says where its request is.
    Handed { marker: u8, connection: OwnedFd },
    /// Something the proxy will not take: a descriptor that is not a connected TCP socket, more
    /// than one, one with an unknown marker, or a control message cut short.
    Refused,
}

/// Hands `connection` to the proxy at the other end of `socket`, behind `marker`.
pub async fn send(socket: &UnixStream, marker: u8, connection: BorrowedFd<'_>) -> io::Result<()> {
    loop {
        socket.writable().await?;
        let sent = socket.try_io(Interest::WRITABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            let fds = [connection];
            if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
                return Err(io::Error::other("no room for the descriptor"));
            }
            Ok(rustix::net::sendmsg(
                socket.as_fd(),
                &[IoSlice::new(&[marker])],
                &mut control,
                SendFlags::NOSIGNAL,
            )?)
        });
        match sent {
            Ok(1) => return Ok(()),
            Ok(_) => return Err(io::ErrorKind::WriteZero.into()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// Reads the first byte of a connection to a job's socket and what came attached to it.
pub async fn receive(socket: &UnixStream) -> io::Result<Received> {
    loop {
        socket.readable().await?;
        match socket.try_io(Interest::READABLE, || receive_now(socket.as_fd())) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            other => return other,
        }
    }
}

pub(crate) fn receive_now(socket: BorrowedFd<'_>) -> io::Result<Received> {
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MOST))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        socket,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    // Every descriptor that arrived is owned here, so each one not taken is closed on return.
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut other = false;
    for message in control.drain() {
        match message {
            RecvAncillaryMessage::ScmRights(rights) => fds.extend(rights),
            _ => other = true,
        }
    }
    if got.bytes == 0 {
        return Ok(Received::Closed);
    }
    let cut = got.flags.contains(rustix::net::ReturnFlags::CTRUNC);
    if fds.is_empty() && !cut && !other {
        return Ok(Received::Byte(byte[0]));
    }
    let marker = byte[0];
    if cut || other || fds.len() != 1 || ![REQUEST_ON_IT, REQUEST_HERE].contains(&marker) {
        return Ok(Received::Refused);
    }
    let connection = fds.remove(0);
    if !is_connected_tcp(connection.as_fd()) {
        return Ok(Received::Refused);
    }
    Ok(Received::Handed { marker, connection })
}

/// Whether `fd` is a connected TCP socket over IPv4 or IPv6 (and not one that listens).
pub fn is_connected_tcp(fd: BorrowedFd<'_>) -> bool {
    use rustix::net::sockopt;
    sockopt::socket_type(fd).is_ok_and(|t| t == SocketType::STREAM)
        && sockopt::socket_domain(fd)
            .is_ok_and(|d| d == AddressFamily::INET || d == AddressFamily::INET6)
        && sockopt::socket_protocol(fd).is_ok_and(|p| p == Some(rustix::net::ipproto::TCP))
        && sockopt::socket_acceptconn(fd).is_ok_and(|listening| !listening)
        && rustix::net::getpeername(fd).is_ok()
}

/// A handed-over connection as a Tokio stream.
pub fn tcp_stream(connection: OwnedFd) -> io::Result<tokio::net::TcpStream> {
    let std = std::net::TcpStream::from(connection);
    std.set_nonblocking(true)?;
    let _ = std.set_nodelay(true);
    tokio::net::TcpStream::from_std(std)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn tcp_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    /// Sends `marker` with `fds` attached, as a hostile job could.
    fn send_raw(socket: &std::os::unix::net::UnixStream, marker: u8, fds: &[BorrowedFd<'_>]) {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
        rustix::net::sendmsg(
            socket,
            &[IoSlice::new(&[marker])],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .unwrap();
    }

    fn pair() -> (std::os::unix::net::UnixStream, UnixStream) {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        (a, UnixStream::from_std(b).unwrap())
    }

    #[tokio::test]
    async fn a_connection_handed_over_is_the_same_connection() {
        let (client, accepted) = tcp_pair().await;
        let (a, b) = UnixStream::pair().unwrap();
        send(&a, REQUEST_ON_IT, accepted.as_fd()).await.unwrap();
        drop(accepted);
        drop(a);
        let Received::Handed { marker, connection } = receive(&b).await.unwrap() else {
            panic!("nothing handed over")
        };
        assert_eq!(marker, REQUEST_ON_IT);
        let mut proxy_side = tcp_stream(connection).unwrap();
        let mut client = client;
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        proxy_side.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        // The socket itself has nothing more.
        assert!(matches!(receive(&b).await.unwrap(), Received::Closed));
    }

    #[tokio::test]
    async fn a_plain_client_is_read_from_its_first_byte() {
        let (a, b) = pair();
        use std::io::Write;
        (&a).write_all(b"CONNECT").unwrap();
        assert!(matches!(receive(&b).await.unwrap(), Received::Byte(b'C')));
    }

    #[tokio::test]
    async fn what_is_not_a_connected_tcp_socket_is_refused() {
        let (_client, accepted) = tcp_pair().await;
        let listening = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let unconnected = rustix::net::socket(
            AddressFamily::INET,
            SocketType::STREAM,
            Some(rustix::net::ipproto::TCP),
        )
        .unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.connect(udp.local_addr().unwrap()).unwrap();
        let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
        let file = std::fs::File::open("/etc/hostname").unwrap();
        let (unix, _unix_peer) = std::os::unix::net::UnixStream::pair().unwrap();

        let hostile: Vec<(&str, u8, Vec<BorrowedFd<'_>>)> = vec![
            ("a listening socket", REQUEST_ON_IT, vec![listening.as_fd()]),
            (
                "an unconnected socket",
                REQUEST_ON_IT,
                vec![unconnected.as_fd()],
            ),
            ("a UDP socket", REQUEST_ON_IT, vec![udp.as_fd()]),
            ("a pipe", REQUEST_ON_IT, vec![pipe_r.as_fd()]),
            ("a file", REQUEST_HERE, vec![file.as_fd()]),
            ("a unix socket", REQUEST_ON_IT, vec![unix.as_fd()]),
            (
                "two connections",
                REQUEST_ON_IT,
                vec![accepted.as_fd(), accepted.as_fd()],
            ),
            ("an unknown marker", b'C', vec![accepted.as_fd()]),
            ("too many descriptors", REQUEST_ON_IT, vec![file.as_fd(); 8]),
        ];
        for (what, marker, fds) in &hostile {
            let (a, b) = pair();
            send_raw(&a, *marker, fds);
            let got = receive(&b).await.unwrap();
            assert!(matches!(got, Received::Refused), "{what}: {got:?}");
        }
        // The control: the same way of sending, with the one connection, is taken.
        let (a, b) = pair();
        send_raw(&a, REQUEST_ON_IT, &[accepted.as_fd()]);
        assert!(matches!(
            receive(&b).await.unwrap(),
            Received::Handed { .. }
        ));
    }

    #[tokio::test]
    async fn descriptors_not_taken_are_closed() {
        // Only this test opens its file, so the descriptors to it are this test's alone.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sent");
        std::fs::write(&path, "x").unwrap();
        let count = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|target| *target == path)
                .count()
        };
        let file = std::fs::File::open(&path).unwrap();
        let (a, b) = pair();
        assert_eq!(count(), 1, "the file is open once");
        for _ in 0..50 {
            send_raw(&a, REQUEST_ON_IT, &[file.as_fd(); 8]);
            assert!(matches!(receive(&b).await.unwrap(), Received::Refused));
        }
        assert_eq!(count(), 1, "descriptors were left open");
    }
}
