//! The proxy's control socket: how a worker (or doctor) asks the proxy, one JSON line a request and
//! one a reply per connection. `open` gives a job its socket, `close` takes it away and says what
//! the job was denied, `ping` says the proxy is there. The socket is the worker's user's alone
//! (mode 0600 in a 0700 folder): a job never reaches it.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

use crate::proxy::{DeniedHost, Proxy};

/// The control socket's name in its folder.
pub const SOCKET: &str = "control.sock";
/// The longest request line.
const MAX_LINE: u64 = 8 * 1024;
const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    Ping,
    Open { job: String, socket: PathBuf },
    Close { job: String },
    Denied { job: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Reply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied: Option<Vec<DeniedHost>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<usize>,
}

impl Reply {
    fn error(why: impl ToString) -> Reply {
        Reply {
            ok: false,
            error: Some(why.to_string()),
            ..Reply::default()
        }
    }
}

/// What the proxy does for one request.
pub fn handle(proxy: &Proxy, request: Request) -> Reply {
    match request {
        Request::Ping => Reply {
            ok: true,
            pid: Some(std::process::id()),
            jobs: Some(proxy.jobs()),
            connections: Some(proxy.connections()),
            ..Reply::default()
        },
        Request::Open { job, socket } => match proxy.open_job(&job, &socket) {
            Ok(()) => Reply {
                ok: true,
                ..Reply::default()
            },
            Err(e) => Reply::error(e),
        },
        Request::Close { job } => match proxy.close_job(&job) {
            Some(denied) => Reply {
                ok: true,
                denied: Some(denied),
                ..Reply::default()
            },
            None => Reply::error("no such job"),
        },
        Request::Denied { job } => match proxy.denied(&job) {
            Some(denied) => Reply {
                ok: true,
                denied: Some(denied),
                ..Reply::default()
            },
            None => Reply::error("no such job"),
        },
    }
}

/// Serves the control socket until the task is dropped.
pub async fn serve(proxy: Proxy, listener: UnixListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            let mut reader =
                tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_LINE));
            let got = tokio::time::timeout(TIMEOUT, reader.read_line(&mut line)).await;
            let reply = match got {
                Ok(Ok(n)) if n > 0 => match serde_json::from_str::<Request>(line.trim_end()) {
                    Ok(request) => handle(&proxy, request),
                    Err(_) => Reply::error("not a control request"),
                },
                _ => return,
            };
            let mut text =
                serde_json::to_string(&reply).unwrap_or_else(|_| "{\"ok\":false}".into());
            text.push('\n');
            let _ = write.write_all(text.as_bytes()).await;
        });
    }
}

/// Why a control request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the egress proxy is not answering on its control socket ({0})")]
    Unreachable(io::ErrorKind),
    #[error("the egress proxy's reply cannot be read")]
    Reply,
    #[error("the egress proxy refused: {0}")]
    Refused(String),
}

/// A blocking client of the control socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    path: PathBuf,
}

impl Client {
    pub fn new(path: impl Into<PathBuf>) -> Client {
        Client { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn call(&self, request: &Request) -> Result<Reply, ClientError> {
        let mut stream =
            UnixStream::connect(&self.path).map_err(|e| ClientError::Unreachable(e.kind()))?;
        let _ = stream.set_read_timeout(Some(TIMEOUT));
        let _ = stream.set_write_timeout(Some(TIMEOUT));
        let mut text = serde_json::to_string(request).map_err(|_| ClientError::Reply)?;
        text.push('\n');
        stream
            .write_all(text.as_bytes())
            .map_err(|e| ClientError::Unreachable(e.kind()))?;
        let mut line = String::new();
        BufReader::new(stream)
            .read_line(&mut line)
            .map_err(|e| ClientError::Unreachable(e.kind()))?;
        let reply: Reply = serde_json::from_str(line.trim_end()).map_err(|_| ClientError::Reply)?;
        if reply.ok {
            Ok(reply)
        } else {
            Err(ClientError::Refused(reply.error.unwrap_or_default()))
        }
    }

    pub fn ping(&self) -> Result<Reply, ClientError> {
        self.call(&Request::Ping)
    }

    pub fn open(&self, job: &str, socket: &Path) -> Result<(), ClientError> {
        self.call(&Request::Open {
            job: job.to_owned(),
            socket: socket.to_owned(),
        })
        .map(drop)
    }

    pub fn close(&self, job: &str) -> Result<Vec<DeniedHost>, ClientError> {
        self.call(&Request::Close {
            job: job.to_owned(),
        })
        .map(|r| r.denied.unwrap_or_default())
    }

    pub fn denied(&self, job: &str) -> Result<Vec<DeniedHost>, ClientError> {
        self.call(&Request::Denied {
            job: job.to_owned(),
        })
        .map(|r| r.denied.unwrap_or_default())
    }
}
