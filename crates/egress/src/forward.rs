//! The job side of egress: inside the sandbox, with no network but loopback, the runner listens on
//! a loopback port, and hands each connection it accepts to the job's proxy socket
//! ([`crate::handover`]): the proxy reads the request from it and carries its bytes itself, so
//! nothing inside the sandbox copies them. The proxy variables of the job point at that port.
//!
//! A declared endpoint on the worker's own machine (a local model server at `127.0.0.1:8000`) is
//! on the sandbox's loopback too, where `NO_PROXY` sends a client directly: the runner listens on
//! that address and port inside as well, asks the proxy for a tunnel to exactly that endpoint, and
//! hands the connection over with the request ([`serve_endpoint`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use config::url::Host;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

use crate::handover;

/// The loopback port inside the sandbox the proxy variables point at.
pub const PORT: u16 = 3128;

/// The job's proxy socket, as the sandbox has it.
pub const SOCKET_IN_JOB: &str = "/job/egress.sock";

/// The proxy URL of a job's `HTTPS_PROXY` and `HTTP_PROXY`.
pub fn proxy_url() -> String {
    format!("http://127.0.0.1:{PORT}")
}

/// What `NO_PROXY` keeps direct: the job's own loopback (the hub's servers).
pub const NO_PROXY: &str = "127.0.0.1,localhost,::1";

/// Hands every connection to `listener` to the proxy at `socket`, until the task is dropped.
pub async fn serve(listener: TcpListener, socket: PathBuf) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            continue;
        };
        // Here, not in a task of its own: a connect to a unix socket and one message are done at
        // once, and a task would cost the connection a wakeup. Once sent, the proxy holds the
        // connection: both ends here close.
        let _ = tcp.set_nodelay(true);
        if let Ok(unix) = UnixStream::connect(&socket).await {
            let _ = handover::send(&unix, handover::REQUEST_ON_IT, tcp.as_fd()).await;
        }
    }
}

/// Binds the forwarder's port on the job's loopback.
pub async fn bind() -> std::io::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", PORT)).await
}

/// Whether the job has a proxy socket to forward to.
pub fn has_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// A job's endpoint on the worker's own machine, as the runner serves it inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopbackEndpoint {
    /// `host:port` as the proxy is asked for it (a CONNECT to exactly the declared endpoint).
    pub authority: String,
    /// Where the runner listens for it on the sandbox's loopback.
    pub listen: Vec<SocketAddr>,
}

/// The endpoints the runner's input names (`host:port`, as `127.0.0.1:8000`), each that is on the
/// machine's loopback (a host that is not, or an entry that is not `host:port`, is left out: the
/// proxy is reached for it through the proxy variables as for any other host).
pub fn loopback_endpoints(authorities: &[String]) -> Vec<LoopbackEndpoint> {
    let mut out: Vec<LoopbackEndpoint> = Vec::new();
    for authority in authorities
        .iter()
        .map(|a| a.trim())
        .filter(|a| !a.is_empty())
    {
        let Some((host, port)) = config::url::host_port(&format!("http://{authority}")) else {
            continue;
        };
        let listen: Vec<IpAddr> = match &host {
            Host::Name(_) if config::url::is_loopback(&host) => {
                vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()]
            }
            Host::Ipv4(a) if a.is_loopback() => vec![(*a).into()],
            Host::Ipv6(a) if a.is_loopback() => vec![(*a).into()],
            Host::Ipv6(a) => match a.to_ipv4_mapped() {
                Some(v4) if v4.is_loopback() => vec![v4.into()],
                _ => continue,
            },
            _ => continue,
        };
        if port == 0 || out.iter().any(|e| e.authority == format!("{host}:{port}")) {
            continue;
        }
        out.push(LoopbackEndpoint {
            authority: format!("{host}:{port}"),
            listen: listen
                .into_iter()
                .map(|a| SocketAddr::new(a, port))
                .collect(),
        });
    }
    out
}

/// Binds `endpoint`'s addresses on the job's loopback: the first must bind; a further one (`::1`
/// for `localhost`, on a loopback without IPv6) may not.
pub async fn bind_endpoint(endpoint: &LoopbackEndpoint) -> std::io::Result<Vec<TcpListener>> {
    let mut out = Vec::new();
    for (i, addr) in endpoint.listen.iter().enumerate() {
        match TcpListener::bind(addr).await {
            Ok(l) => out.push(l),
            Err(e) if i == 0 => return Err(e),
            Err(_) => {}
        }
    }
    Ok(out)
}

/// The longest answer head the proxy gives a CONNECT.
const MAX_ANSWER: usize = 16 * 1024;

/// Hands every connection to `listener` to the proxy at `socket` as a tunnel to exactly
/// `authority`, until the task is dropped. A connection the proxy refuses is closed.
pub async fn serve_endpoint(listener: TcpListener, socket: PathBuf, authority: String) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            continue;
        };
        let socket = socket.clone();
        let authority = authority.clone();
        tokio::spawn(async move {
            let _ = tunnel_to(tcp, &socket, &authority).await;
        });
    }
}

/// Asks for the tunnel on the socket, with the connection attached, and waits for the answer's
/// head: the socket stays open until the proxy has answered, and the connection's bytes are the
/// proxy's to carry from then on (a refusal closes it with nothing sent).
async fn tunnel_to(
    tcp: tokio::net::TcpStream,
    socket: &Path,
    authority: &str,
) -> std::io::Result<()> {
    let _ = tcp.set_nodelay(true);
    let mut unix = UnixStream::connect(socket).await?;
    handover::send(&unix, handover::REQUEST_HERE, tcp.as_fd()).await?;
    drop(tcp);
    unix.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await?;
    let mut head = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() <= MAX_ANSWER {
        let n = unix.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_loopback_endpoints_of_the_runners_input() {
        let named = "127.0.0.1:8000, localhost:9000,llm.example:8000,[::1]:7000,127.0.0.1:8000,bad,10.0.0.1:80,";
        let got = loopback_endpoints(&named.split(',').map(str::to_owned).collect::<Vec<_>>());
        let v4 = |p| SocketAddr::new(Ipv4Addr::LOCALHOST.into(), p);
        let v6 = |p| SocketAddr::new(Ipv6Addr::LOCALHOST.into(), p);
        assert_eq!(
            got,
            [
                LoopbackEndpoint {
                    authority: "127.0.0.1:8000".into(),
                    listen: vec![v4(8000)],
                },
                LoopbackEndpoint {
                    authority: "localhost:9000".into(),
                    listen: vec![v4(9000), v6(9000)],
                },
                LoopbackEndpoint {
                    authority: "[::1]:7000".into(),
                    listen: vec![v6(7000)],
                },
            ]
        );
        assert!(loopback_endpoints(&[]).is_empty());
    }

    /// A stand-in for the proxy on a unix socket: it takes the connection handed over, answers
    /// each CONNECT on the socket with `status`, then (when it is 200) echoes what the connection
    /// sends, after a greeting; it reports the request heads it read.
    async fn fake_proxy(
        dir: &Path,
        status: u16,
    ) -> (PathBuf, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let path = dir.join("egress.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let handover::Received::Handed { marker, connection } =
                        handover::receive(&s).await.unwrap()
                    else {
                        panic!("nothing handed over")
                    };
                    assert_eq!(marker, handover::REQUEST_HERE);
                    let mut tcp = handover::tcp_stream(connection).unwrap();
                    let mut head = Vec::new();
                    let mut b = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        s.read_exact(&mut b).await.unwrap();
                        head.push(b[0]);
                    }
                    tx.send(String::from_utf8(head).unwrap()).unwrap();
                    let answer = format!("HTTP/1.1 {status} Whatever\r\n\r\n");
                    if status != 200 {
                        // A refusal's body is the proxy's, never passed on as the endpoint's.
                        s.write_all(format!("{answer}refused").as_bytes())
                            .await
                            .unwrap();
                        return;
                    }
                    s.write_all(answer.as_bytes()).await.unwrap();
                    tcp.write_all(b"hello ").await.unwrap();
                    let (mut r, mut w) = tcp.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        (path, rx)
    }

    #[tokio::test]
    async fn a_connection_to_a_loopback_endpoint_is_a_tunnel_through_the_proxy() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, mut heads) = fake_proxy(dir.path(), 200).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(serve_endpoint(listener, socket, "127.0.0.1:8000".into()));
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 10];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello ping");
        assert_eq!(
            heads.recv().await.unwrap(),
            "CONNECT 127.0.0.1:8000 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn through_the_real_proxy_a_declared_endpoint_on_this_machine_is_reached() {
        // A local model server, declared; the proxy gives the job its socket.
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let declared = server.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = server.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut b = [0u8; 4];
                    s.read_exact(&mut b).await.unwrap();
                    s.write_all(b"pong").await.unwrap();
                });
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let files = crate::files::RuleFiles {
            allowlist: dir.path().join("egress-allowlist.conf"),
            endpoints: dir.path().join("model-endpoints.json"),
        };
        std::fs::write(&files.allowlist, "").unwrap();
        std::fs::write(
            &files.endpoints,
            format!(
                r#"{{"version": 1, "endpoints": [{{"id": "local", "host": "127.0.0.1", "port": {declared}}}]}}"#
            ),
        )
        .unwrap();
        let proxy = crate::Proxy::new(
            files,
            crate::dns::Resolver::System,
            crate::Limits::default(),
        );
        let socket = dir.path().join("egress.sock");
        proxy.open_job("job-1", &socket).unwrap();
        let relay = |authority: String| {
            let socket = socket.clone();
            async move {
                let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
                let port = l.local_addr().unwrap().port();
                tokio::spawn(serve_endpoint(l, socket, authority));
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .unwrap()
            }
        };
        let mut c = relay(format!("127.0.0.1:{declared}")).await;
        c.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
        // Its neighbour is not declared: refused, and the job's record will say so.
        let mut c = relay(format!("127.0.0.1:{}", declared + 1)).await;
        let mut got = Vec::new();
        c.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty());
        let denied = proxy.close_job("job-1").unwrap();
        assert_eq!(denied.len(), 1, "{denied:?}");
        assert_eq!(
            (denied[0].host.as_str(), denied[0].port),
            ("127.0.0.1", declared + 1)
        );
    }

    #[tokio::test]
    async fn a_refused_tunnel_closes_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, mut heads) = fake_proxy(dir.path(), 403).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(serve_endpoint(listener, socket, "localhost:9000".into()));
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty(), "{got:?}");
        assert!(
            heads
                .recv()
                .await
                .unwrap()
                .starts_with("CONNECT localhost:9000 ")
        );
    }
}
