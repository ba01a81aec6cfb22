//! The job side of egress: inside the sandbox, with no network but loopback, the runner listens on
//! a loopback port and carries each connection to the job's proxy socket as it is. The proxy
//! variables of the job point at that port.

use std::path::{Path, PathBuf};

use tokio::net::{TcpListener, UnixStream};

use crate::proxy::{Activity, End, carry_both};

/// The pipe of each way of a connection.
const BUFFER: usize = 64 * 1024;

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

/// Carries every connection to `listener` to `socket`, until the task is dropped.
pub async fn serve(listener: TcpListener, socket: PathBuf) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            continue;
        };
        let socket = socket.clone();
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            if let Ok(unix) = UnixStream::connect(&socket).await {
                // Spliced, as the proxy's side of the socket is: the bytes stay in the kernel.
                let _ =
                    carry_both(End::Tcp(&tcp), End::Unix(&unix), BUFFER, &Activity::new()).await;
            }
        });
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
