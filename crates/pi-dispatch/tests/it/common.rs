//! Running the binary in a scratch deployment folder.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A scratch deployment folder that the binary runs in, with its environment cleared of settings.
pub struct Deployment {
    pub dir: tempfile::TempDir,
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Deployment {
    pub fn new() -> Deployment {
        Deployment {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The deployment's records (its queue file).
    pub fn records(&self) -> records::store::Records {
        records::store::Records::sqlite(&self.path().join("state/queue.sqlite3")).unwrap()
    }

    /// Job `id`'s record as stored, if it has one.
    pub fn record(&self, id: &str) -> Option<serde_json::Value> {
        let r = self.records().read(id).ok()?;
        Some(serde_json::to_value(r).unwrap())
    }

    /// How many records the deployment holds.
    pub fn record_count(&self) -> u64 {
        self.records().count().unwrap()
    }

    /// Stores `record` in place of job `id`'s, as nothing but a test could.
    pub fn replace_record(&self, id: &str, record: &serde_json::Value) {
        let db = rusqlite::Connection::open(self.path().join("state/queue.sqlite3")).unwrap();
        let changed = db
            .execute(
                "UPDATE records SET body = ?1 WHERE id = ?2",
                (serde_json::to_string(record).unwrap(), id),
            )
            .unwrap();
        assert_eq!(changed, 1, "no record {id}");
    }

    /// Writes `text` at `rel` under the folder, creating parent folders.
    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pi-dispatch"));
        cmd.args(args);
        self.isolate(&mut cmd);
        cmd
    }

    /// Runs `cmd` in the folder, with nothing of the developer's own setup: no setting, no pi
    /// folder, and a home inside the scratch folder.
    pub fn isolate(&self, cmd: &mut Command) {
        cmd.current_dir(self.path()).env("NO_COLOR", "1");
        // Nothing of the developer's own setup reaches the command: no setting, no pi folder, and
        // a home inside the scratch folder.
        for name in [
            "PI_GLOBAL_PI_DIR",
            "PI_TRIGGERS_FILE",
            "PI_EGRESS",
            "PI_FORWARD_ENV",
            "PI_EGRESS_ALLOWLIST",
            "PI_MODEL_ENDPOINTS",
            "PI_EGRESS_NAMESERVER",
            "PI_EGRESS_PROXY_DIR",
            "PI_CODING_AGENT_DIR",
            "PI_DISPATCH_TEST_CRASH",
            "PI_DIR",
        ] {
            cmd.env_remove(name);
        }
        cmd.env("HOME", self.path().join("home"));
    }

    /// A deployment other users may enter (mode 0755, as a job's user needs), with `init`'s
    /// files and the default job image built by `image install` (given `image_args` too).
    pub fn with_image(image_args: &[&str]) -> Deployment {
        use std::os::unix::fs::PermissionsExt as _;
        let d = Deployment::new();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(d.run(&["init"]).code, 0);
        d.install_image(image_args);
        d
    }

    /// `image install` from the project's `node_modules` (with `extra` arguments); it must work.
    pub fn install_image(&self, extra: &[&str]) {
        let nm = node_modules();
        let mut args = vec!["image", "install", "--from", nm.to_str().unwrap()];
        args.extend_from_slice(extra);
        let image = self.run(&args);
        assert_eq!(image.code, 0, "{}", image.stderr);
    }

    pub fn run(&self, args: &[&str]) -> Run {
        Run::from(self.command(args).output().unwrap())
    }

    /// Output with the folder's path replaced by `[DIR]`, for snapshots.
    pub fn redact(&self, text: &str) -> String {
        let real = self.path().canonicalize().unwrap();
        text.replace(&real.display().to_string(), "[DIR]")
            .replace(&self.path().display().to_string(), "[DIR]")
    }
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8(o.stdout).unwrap(),
            stderr: String::from_utf8(o.stderr).unwrap(),
        }
    }
}

/// Canary values planted in the host's files: none may appear in any output or in any file
/// pi-dispatch writes.
pub const CANARIES: [&str; 8] = [
    "CNRY-header-7f3a",
    "CNRY-env-51b2",
    "CNRY-query-9c0d",
    "CNRY-arg-44e1",
    "CNRY-bang-0a9f",
    "CNRY-models-key-3e3e",
    "CNRY-auth-json-6d6d",
    "CNRY-mcp-auth-2b2b",
];

/// A realistic `~/.pi/agent`: good servers, leaky ones, a runner-based one, a turned-off one, a
/// models.json, skills (one holding a link), APPEND_SYSTEM.md, and pi's credential files.
pub fn write_host_agent(root: &Path) -> PathBuf {
    let agent = root.join("home/.pi/agent");
    std::fs::create_dir_all(agent.join("skills/review")).unwrap();
    std::fs::create_dir_all(agent.join("skills/triage")).unwrap();
    let files: [(&str, &str); 8] = [
        ("mcp.json", HOST_MCP),
        (
            "models.json",
            r#"{"providers": {"local": {"baseUrl": "https://llm.internal.example:8443/v1", "api": "openai-completions", "apiKey": "$LOCAL_LLM_KEY", "models": [{"id": "qwen"}]}}}"#,
        ),
        (
            "skills/review/SKILL.md",
            "---\nname: review\ndescription: Review a change\n---\nRead the diff.\n",
        ),
        (
            "skills/triage/SKILL.md",
            "---\nname: triage\ndescription: Triage an issue\n---\n",
        ),
        (
            "APPEND_SYSTEM.md",
            "Always run the tests before you finish.\n",
        ),
        (
            "auth.json",
            r#"{"anthropic": {"type": "api_key", "key": "CNRY-auth-json-6d6d"}}"#,
        ),
        (
            "mcp-auth.json",
            r#"{"vault|https://vault.example.com/mcp": {"tokens": "CNRY-mcp-auth-2b2b"}}"#,
        ),
        ("settings.json", r#"{"defaultModel": "x"}"#),
    ];
    for (name, text) in files {
        std::fs::write(agent.join(name), text).unwrap();
    }
    std::fs::write(root.join("outside-secret"), "CNRY-header-7f3a").unwrap();
    std::os::unix::fs::symlink(
        root.join("outside-secret"),
        agent.join("skills/review/notes.md"),
    )
    .unwrap();
    agent
}

pub const HOST_MCP: &str = r#"{
  "autoEnableCodemode": true,
  "mcpServers": {
    "docs": {
      "url": "https://mcp.example.com/mcp",
      "headers": { "Authorization": "Bearer ${DOCS_TOKEN}" },
      "description": "Search the product documentation"
    },
    "tickets": {
      "url": "https://tickets.example.com/mcp?api_key=CNRY-query-9c0d",
      "headers": { "X-Api-Key": "CNRY-header-7f3a" },
      "description": "Support tickets"
    },
    "github": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-github", "--token=CNRY-arg-44e1"],
      "env": { "GITHUB_PERSONAL_ACCESS_TOKEN": "CNRY-env-51b2" },
      "description": "GitHub"
    },
    "memory": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-memory"],
      "allowPackageRunner": true,
      "description": "Scratch memory for the agent"
    },
    "vault": {
      "url": "HTTPS://Vault.Example.com:443/mcp",
      "headers": { "Authorization": "!op read CNRY-bang-0a9f" },
      "description": "Secrets vault",
      "oauth": { "clientId": "abc" }
    },
    "local-files": {
      "command": "/home/me/bin/files-server",
      "cwd": "/home/me/src",
      "description": "Files on my laptop"
    },
    "wiki": {
      "url": "https://wiki.internal.example:8443/mcp",
      "description": "Team wiki"
    },
    "old-wiki": { "url": "https://wiki.example.com/mcp", "description": "Old wiki", "enabled": false }
  }
}"#;

/// Every file under `dir` (not following links), with its bytes.
pub fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                out.push((entry.path(), std::fs::read(entry.path()).unwrap()));
            }
        }
    }
    out
}

pub use testkit::node_modules;

/// Live processes (zombies aside) other than `except` whose environment holds `marker`.
pub fn processes_with(marker: &str, except: u32) -> Vec<(u32, String)> {
    testkit::processes_with(marker)
        .into_iter()
        .filter(|(pid, _)| *pid != except)
        .collect()
}

/// Runs git in `repo` as a test's author would, and insists that it works.
pub fn git(repo: &Path, args: &[&str]) {
    succeeds(
        Command::new("git")
            .args(["-c", "user.email=t@t", "-c", "user.name=t", "-C"])
            .arg(repo)
            .args(args),
    );
}

/// Runs `cmd`, which must start and succeed (else the test fails with what it printed); its
/// standard output.
pub fn succeeds(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} cannot start: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A long-running command (`receiver`, `panel`) started with `--log-format json`: its address,
/// once it logged `event` with it, and every line it has logged since it started.
pub struct Listening {
    child: std::process::Child,
    pub url: String,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Listening {
    pub fn start(mut cmd: Command, event: &str) -> Listening {
        use std::io::{BufRead as _, BufReader};
        let mut child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let url = loop {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("it ended before {event}"))
                .unwrap();
            log.lock().unwrap().push(line.clone());
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if v["event"] == event {
                break format!("http://{}", v["addr"].as_str().unwrap());
            }
        };
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        Listening { child, url, log }
    }

    /// Every line logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
