//! The relay pi starts for each of the job's servers (`pi-dispatch job-relay --socket PATH NAME`):
//! to pi an ordinary stdio MCP server, which it reaches with its stdio client, the cheapest it
//! has; to the hub one connection to its unix socket. It sends one line first, the server's name
//! and the token from pi's environment ([`crate::pi_config::HUB_TOKEN_VARIABLE`]), then copies
//! bytes both ways without reading them: every message is the hub's business. It ends as soon as
//! either side closes, so that pi, which gives a server half a second to exit after closing its
//! input, never waits.

use std::io::Write as _;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// The longest first line the hub reads.
pub const MAX_HELLO: usize = 4096;

/// How long the hub waits for the first line of a connection it has taken.
pub const HELLO_WITHIN: Duration = Duration::from_secs(10);

/// What the hub answers a first line it does not take (wrong token or unknown server), before it
/// closes the connection.
pub const REFUSED: &str = "Unauthorized: the hub refused the connection";

/// The first line of a connection: the server's name and the `Authorization` value.
pub fn hello(server: &str, token: &str) -> String {
    format!("{server} Bearer {token}\n")
}

/// The server's name and the `Authorization` value of a first line (without its end).
pub fn read_hello(line: &[u8]) -> Option<(&str, &[u8])> {
    let line = std::str::from_utf8(line).ok()?;
    let (name, authorization) = line.split_once(' ')?;
    (!name.is_empty()).then_some((name, authorization.as_bytes()))
}

/// Why the relay could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    #[error(
        "{} is not set: the relay runs only as pi's, inside a job",
        crate::pi_config::HUB_TOKEN_VARIABLE
    )]
    NoToken,
    #[error("the hub's socket cannot be reached ({0})")]
    Connect(std::io::ErrorKind),
    #[error("the relay cannot use its standard streams ({0})")]
    Streams(std::io::ErrorKind),
}

/// Relays the process's standard input and output to server `server` at the hub's `socket`,
/// until either side closes; returns then.
pub fn run(socket: &Path, server: &str) -> Result<(), RelayError> {
    // Like pi, whose environment it shares: nothing of the job without pi's marker may read this
    // process's memory or environment, and with this not even with it.
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let token = std::env::var(crate::pi_config::HUB_TOKEN_VARIABLE)
        .ok()
        .filter(|t| !t.is_empty())
        .ok_or(RelayError::NoToken)?;
    let mut to_hub = UnixStream::connect(socket).map_err(|e| RelayError::Connect(e.kind()))?;
    to_hub
        .write_all(hello(server, &token).as_bytes())
        .map_err(|e| RelayError::Connect(e.kind()))?;
    drop(token);
    let mut from_hub = to_hub
        .try_clone()
        .map_err(|e| RelayError::Streams(e.kind()))?;
    let stdout = duplicate(&std::io::stdout())?;
    let stdin = duplicate(&std::io::stdin())?;
    // Whichever direction ends first ends the relay.
    let (done, ended) = std::sync::mpsc::channel::<()>();
    let back = done.clone();
    std::thread::spawn(move || {
        let mut stdout = stdout;
        let _ = pass_on(&mut from_hub, &mut stdout);
        let _ = back.send(());
    });
    std::thread::spawn(move || {
        let mut stdin = stdin;
        let _ = pass_on(&mut stdin, &mut to_hub);
        let _ = to_hub.shutdown(std::net::Shutdown::Write);
        let _ = done.send(());
    });
    let _ = ended.recv();
    Ok(())
}

/// Copies what `from` gives to `to` as it comes, to the end of `from`. A plain loop of reads and
/// writes: `std::io::copy` would splice, and a splice from a socket waits to fill its length
/// before it returns, holding a message back.
fn pass_on(from: &mut impl std::io::Read, to: &mut impl std::io::Write) -> std::io::Result<()> {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buffer[..n])?;
    }
}

/// `job-relay --socket PATH NAME`, as a command: the exit status says whether it could start (2:
/// its arguments, 1: the token or the socket), with the reason on standard error, which pi keeps.
pub fn main(args: &[std::ffi::OsString]) -> std::process::ExitCode {
    let (socket, server) = match args {
        [flag, socket, server] if flag == "--socket" => (socket, server),
        _ => {
            eprintln!("pi-dispatch: usage: job-relay --socket PATH NAME");
            return std::process::ExitCode::from(2);
        }
    };
    let Some(server) = server.to_str() else {
        eprintln!("pi-dispatch: job-relay: the server's name is not text");
        return std::process::ExitCode::from(2);
    };
    match run(Path::new(socket), server) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pi-dispatch: job-relay: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

/// A standard stream as a plain file (no buffering between pi and the hub).
fn duplicate(stream: &impl std::os::fd::AsFd) -> Result<std::fs::File, RelayError> {
    stream
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .map_err(|e| RelayError::Streams(e.kind()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_names_the_server_then_the_authorization() {
        let line = hello("docs.v2", "abc123");
        assert_eq!(line, "docs.v2 Bearer abc123\n");
        let (name, authorization) = read_hello(line.trim_end().as_bytes()).unwrap();
        assert_eq!(name, "docs.v2");
        assert_eq!(authorization, b"Bearer abc123");
        assert_eq!(read_hello(b"no-space"), None);
        assert_eq!(read_hello(b" Bearer x"), None);
        assert_eq!(read_hello(&[0xff, b' ', b'x']), None);
    }
}
