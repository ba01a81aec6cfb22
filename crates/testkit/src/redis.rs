//! A real Redis for a test: Debian's `redis-server` (installed by `scripts/install-tests`), started on a
//! unix socket in a folder of its own (no port to race for), with its data in that folder. It can
//! be stopped and started again on the same data (append-only file on, when asked), and is killed
//! when dropped.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian's package puts it.
pub const REDIS_SERVER: &str = "/usr/bin/redis-server";

pub struct RedisServer {
    dir: tempfile::TempDir,
    /// `appendfsync`'s value, with the append-only file on; `None`: no persistence.
    aof: Option<&'static str>,
    password: Option<String>,
    /// A TLS port on 127.0.0.1 besides the socket, its certificate signed by `ca.pem` in `dir`.
    tls_port: Option<u16>,
    child: Option<Child>,
}

impl RedisServer {
    /// A server with no persistence.
    pub fn start() -> RedisServer {
        RedisServer::start_with(false)
    }

    /// A server; with `aof`, its append-only file on and synced on every write, so a restart
    /// keeps everything it acknowledged.
    pub fn start_with(aof: bool) -> RedisServer {
        assert!(
            Path::new(REDIS_SERVER).is_file(),
            "{REDIS_SERVER} is missing: install Debian's redis-server (bash scripts/install-tests)"
        );
        RedisServer::start_as(aof.then_some("always"), None)
    }

    /// A server whose append-only file is synced as `appendfsync` says (`always`, `everysec`).
    pub fn start_with_fsync(appendfsync: &'static str) -> RedisServer {
        RedisServer::start_as(Some(appendfsync), None)
    }

    /// A server that takes `password` (given in its configuration file, never on its command
    /// line).
    pub fn start_with_password(password: &str) -> RedisServer {
        RedisServer::start_as(None, Some(password.to_owned()))
    }

    /// A server that also takes TLS connections on a loopback port ([`RedisServer::tls_url`]),
    /// with a certificate for `localhost` signed by a CA of its own ([`RedisServer::ca_file`]).
    pub fn start_tls() -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        let ssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("openssl");
            assert!(out.status.success(), "openssl {args:?}");
        };
        ssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=pi-dispatch test CA",
        ]);
        ssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        std::fs::write(dir.path().join("ext"), "subjectAltName=DNS:localhost\n").unwrap();
        ssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext",
        ]);
        let mut server = RedisServer {
            dir,
            aof: None,
            password: None,
            tls_port: Some(crate::free_port()),
            child: None,
        };
        server.run();
        server
    }

    /// `PI_QUEUE` for the TLS port.
    pub fn tls_url(&self) -> String {
        format!("rediss://localhost:{}/0", self.tls_port.unwrap_or(0))
    }

    /// The CA that signed the TLS certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn start_as(aof: Option<&'static str>, password: Option<String>) -> RedisServer {
        assert!(
            Path::new(REDIS_SERVER).is_file(),
            "{REDIS_SERVER} is missing: install Debian's redis-server (bash scripts/install-tests)"
        );
        let mut server = RedisServer {
            dir: tempfile::tempdir().unwrap(),
            aof,
            password,
            tls_port: None,
            child: None,
        };
        server.run();
        server
    }

    fn run(&mut self) {
        let socket = self.socket();
        let _ = std::fs::remove_file(&socket);
        let (aof, fsync) = match self.aof {
            Some(fsync) => ("yes", fsync),
            None => ("no", "always"),
        };
        let conf = self.dir.path().join("redis.conf");
        let mut text = self
            .password
            .as_ref()
            .map(|p| format!("requirepass {p}\n"))
            .unwrap_or_default();
        if let Some(port) = self.tls_port {
            let file = |name: &str| self.dir.path().join(name).display().to_string();
            text.push_str(&format!(
                "bind 127.0.0.1\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\n",
                file("server.pem"),
                file("server.key"),
                file("ca.pem")
            ));
        }
        std::fs::write(&conf, text).unwrap();
        let child = Command::new(REDIS_SERVER)
            .arg(&conf)
            .args(["--port", "0", "--unixsocket"])
            .arg(&socket)
            .args(["--unixsocketperm", "700", "--dir"])
            .arg(self.dir.path())
            .args(["--save", "", "--appendonly", aof, "--appendfsync", fsync])
            .args([
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
                "--logfile",
                "",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.answers() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer within 20 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether it answers PING with PONG.
    fn answers(&self) -> bool {
        let Ok(mut s) = UnixStream::connect(self.socket()) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut buf = [0u8; 64];
        // Without the password, PING is refused with NOAUTH: the server answers all the same.
        s.write_all(b"PING\r\n").is_ok()
            && s.read(&mut buf)
                .is_ok_and(|n| buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"))
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// `PI_QUEUE` for this server (database `db`).
    pub fn url_db(&self, db: u32) -> String {
        format!("redis+unix://{}?db={db}", self.socket().display())
    }

    /// `PI_QUEUE` for this server's database 0.
    pub fn url(&self) -> String {
        self.url_db(0)
    }

    /// Stops it as an operator would (SIGTERM: it writes what it holds and exits), and waits.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    /// The server's process id while it runs (a test pauses it with SIGSTOP).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts it again on the same data and socket.
    pub fn restart(&mut self) {
        self.stop();
        self.run();
    }

    /// Runs a command with redis-cli's wire format (for tests that read Redis's own view).
    pub fn command(&self, args: &[&str]) -> String {
        let mut s = UnixStream::connect(self.socket()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(req.as_bytes()).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        // One reply: read until the socket has nothing more for a moment.
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
