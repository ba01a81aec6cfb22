//! What the long-running HTTP commands (`receiver`, `panel`) share: where they listen, and serving
//! on a runtime of their own until SIGTERM or SIGINT.

use std::net::SocketAddr;

use crate::context::Context;

/// The address to listen on: `--listen`, else the setting `setting`, else `default`.
pub fn address(
    ctx: &Context,
    given: Option<&str>,
    setting: &str,
    default: &str,
) -> anyhow::Result<SocketAddr> {
    let listen = match given {
        Some(l) => l.to_owned(),
        None => ctx.setting(setting)?.unwrap_or_else(|| default.to_owned()),
    };
    listen.parse().map_err(|_| {
        anyhow::anyhow!("--listen (or {setting}) must be an address and port, such as {default}")
    })
}

/// Binds `addr`, calls `listening` with the address bound (with port 0, the one the system
/// chose), then runs `serve` on the listener until it returns. `what` names the service in errors.
pub fn run<F, Fut>(
    addr: SocketAddr,
    what: &str,
    listening: impl FnOnce(SocketAddr),
    serve: F,
) -> anyhow::Result<()>
where
    F: FnOnce(tokio::net::TcpListener) -> Fut,
    Fut: Future<Output = std::io::Result<()>>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} ({})", e.kind()))?;
        listening(listener.local_addr().unwrap_or(addr));
        serve(listener)
            .await
            .map_err(|e| anyhow::anyhow!("the {what} stopped: {e}"))
    })
}

/// Resolves at SIGTERM or SIGINT (how the receiver and the panel are told to stop).
pub async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
