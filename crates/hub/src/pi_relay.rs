//! The relay pi starts for each of the job's servers (`pi-dispatch job-relay --socket PATH NAME`):
//! to pi an ordinary stdio MCP server, which it reaches with its stdio client, the cheapest it
//! has; to the hub one connection to its unix socket. It sends one message: a line with the
//! server's name and the token from pi's environment ([`crate::pi_config::HUB_TOKEN_VARIABLE`]),
//! and with it its own standard input and output (`SCM_RIGHTS`). From then on the hub reads pi's
//! requests and writes its answers on pi's own streams: the relay never touches a message and
//! adds no hop. It waits until the hub closes the connection (the session is over, or the hub
//! refused it), then exits, so that pi, which gives a server half a second to exit after closing
//! its input, never waits.
//!
//! A client that cannot pass its streams may instead write the same first line and then speak
//! the stdio framing on the connection itself.

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

/// The most file descriptors the first message may carry: the relay's standard input and output.
pub const PASSED_STREAMS: usize = 2;

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

/// Hands the process's standard input and output to the hub at `socket` for server `server`,
/// then waits until the hub is done with them.
pub fn run(socket: &Path, server: &str) -> Result<(), RelayError> {
    use std::io::Read as _;
    // Like pi, whose environment it shares: nothing of the job without pi's marker may read this
    // process's memory or environment, and with this not even with it.
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let token = std::env::var(crate::pi_config::HUB_TOKEN_VARIABLE)
        .ok()
        .filter(|t| !t.is_empty())
        .ok_or(RelayError::NoToken)?;
    let mut to_hub = UnixStream::connect(socket).map_err(|e| RelayError::Connect(e.kind()))?;
    let hello = hello(server, &token);
    drop(token);
    let kind = |e: rustix::io::Errno| std::io::Error::from(e).kind();
    {
        let streams = [rustix::stdio::stdin(), rustix::stdio::stdout()];
        let mut space =
            [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(PASSED_STREAMS))];
        let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
        if !control.push(rustix::net::SendAncillaryMessage::ScmRights(&streams)) {
            return Err(RelayError::Streams(std::io::ErrorKind::OutOfMemory));
        }
        let sent = rustix::net::sendmsg(
            &to_hub,
            &[std::io::IoSlice::new(hello.as_bytes())],
            &mut control,
            rustix::net::SendFlags::NOSIGNAL,
        )
        .map_err(|e| RelayError::Connect(kind(e)))?;
        if sent < hello.len() {
            to_hub
                .write_all(&hello.as_bytes()[sent..])
                .map_err(|e| RelayError::Connect(e.kind()))?;
        }
    }
    // The hub holds pi's streams now: this process lets go of its own copies, so that only the
    // hub's end says when pi's side closes.
    let null = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| RelayError::Streams(e.kind()))?;
    rustix::stdio::dup2_stdin(&null).map_err(|e| RelayError::Streams(kind(e)))?;
    rustix::stdio::dup2_stdout(&null).map_err(|e| RelayError::Streams(kind(e)))?;
    // Until the hub closes the connection.
    let mut rest = [0u8; 64];
    while matches!(to_hub.read(&mut rest), Ok(n) if n > 0) {}
    Ok(())
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
