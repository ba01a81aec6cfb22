//! The runner's step that prepares real pi's private agent folder on the job's path
//! ([`prepare_folder`]): pi's `mcp.json`, `settings.json`, the runner's MCP extension, the
//! overlay's `APPEND_SYSTEM.md` (pi's `models.json` is the model gateway's); and what starting pi
//! takes from here: pi's command line, the `pi` a job's own commands find on `PATH` (always
//! `--no-mcp`), and the report of the runner's extension.
//!
//! pi's built-in MCP extension is switched off and loaded again through the runner's extension
//! (`pi_guard.js`), which hides servers other extensions register, drops `/mcp`, and ends the job
//! when another extension takes a name only the job's MCP may own. The repository's own `.pi`
//! (its `mcp.json`, extensions, settings) is never loaded: pi runs with `--no-approve`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Where pi is and what it runs.
#[derive(Debug, Clone)]
pub struct PiOptions {
    /// The Node.js binary.
    pub node: PathBuf,
    /// pi's package folder (`@earendil-works/pi-coding-agent`), holding [`ENTRY`].
    pub package: PathBuf,
    /// The job's prompt (`/job/prompt.md`), given to pi on its standard input.
    pub prompt: PathBuf,
    /// `provider/model`, when the job names one.
    pub model: Option<String>,
    /// The overlay (`/opt/pi-global`): its `models.json`, `APPEND_SYSTEM.md`, `skills/` and
    /// `extensions/` are pi's.
    pub overlay: Option<PathBuf>,
    /// The image's compile cache of pi's modules (`node-compile-cache`, read-only), when it has
    /// one: see [`link_compile_cache`].
    pub compile_cache: Option<PathBuf>,
}

/// The program pi's package starts as (its `pi` bin): one bundle, which keeps Node's compile cache.
/// The unbundled `dist/cli.js` loads hundreds of modules and starts about twice as slowly.
pub const ENTRY: &str = "dist/bundle/cli.js";

/// What the bundle exports to extensions: the runner's extension takes pi's MCP and codemode
/// extensions from here, so that it shares the running pi's modules instead of loading a second
/// copy of pi from `dist/`.
pub const INDEX: &str = "dist/bundle/index.js";

/// The runner's extension file, before its constants are filled in.
const GUARD_TEMPLATE: &str = include_str!("pi_guard.js");

/// The runner's extension's file name, in the agent folder's `pi-dispatch/`.
const GUARD_FILE: &str = "mcp.mjs";

/// The exit code the extension ends pi with when a name is shadowed.
pub const SHADOWED_EXIT: i32 = 70;

/// The files the runner writes for pi, under the private agent folder.
pub struct AgentFolder {
    pub dir: PathBuf,
}

impl AgentFolder {
    /// The runner's own part of the folder: its extension, pi's shim and shell, the hub's socket.
    pub fn own(&self) -> PathBuf {
        self.dir.join("pi-dispatch")
    }

    pub fn guard(&self) -> PathBuf {
        // An ES module by its name: pi's loader imports it as it is, with no transpile (and so no
        // transpile cache in the job's fresh /tmp).
        self.dir.join("pi-dispatch").join(GUARD_FILE)
    }

    /// Where pi's extension reports a server pi refused or a name another extension shadows: a
    /// file pi writes, in the agent folder's writable part.
    pub fn report(&self) -> PathBuf {
        self.dir.join("pi-dispatch-report.json")
    }

    /// pi's own folder of tools (`rg`, `fd`), which pi looks in before its `PATH`.
    pub fn tools(&self) -> PathBuf {
        self.dir.join("bin")
    }

    /// The folders bound onto themselves for pi in a confined job, so that no process of the job
    /// can rename them away and put others in their place: the agent folder, and each folder
    /// between it and `/tmp` when it is under `/tmp`.
    pub fn pinned(&self) -> Vec<PathBuf> {
        let mut pinned = vec![self.dir.clone()];
        if self.dir.starts_with("/tmp") {
            let mut at = self.dir.parent();
            while let Some(dir) = at.filter(|d| *d != std::path::Path::new("/tmp")) {
                pinned.push(dir.to_owned());
                at = dir.parent();
            }
        }
        pinned.reverse();
        pinned
    }

    /// What is read-only for pi and its tools in a confined job: the runner's own folder (pi's
    /// extension, shell and shim, the hub's socket), pi's folder of tools, and pi's configuration
    /// files. Nothing pi runs or reads as configuration can then be written by a tool.
    pub fn read_only(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.own(), self.tools()];
        for file in [
            "settings.json",
            "mcp.json",
            "models.json",
            "APPEND_SYSTEM.md",
        ] {
            let path = self.dir.join(file);
            if path.exists() {
                paths.push(path);
            }
        }
        paths
    }

    /// What pi must have listed before its prompt: each server the hub serves with its number
    /// of tools, and how long to wait (written once the servers are connected; pi's prompt waits
    /// for it).
    pub fn expected(&self) -> PathBuf {
        self.dir.join("pi-dispatch").join("listed.json")
    }

    /// Where the `pi` shim is: first on the `PATH` pi's tools see.
    pub fn bin(&self) -> PathBuf {
        self.dir.join("pi-dispatch").join("bin")
    }

    /// Node's compile cache as pi sees it (`NODE_COMPILE_CACHE`): one link, under the runner's own
    /// read-only part, to the image's cache ([`link_compile_cache`]).
    pub fn compile_cache(&self) -> PathBuf {
        self.own().join("node-compile-cache")
    }

    /// pi's shell when the runner has none beside it (a runner outside a job image): every
    /// command of pi's bash tool starts here.
    pub fn shell(&self) -> PathBuf {
        self.dir.join("pi-dispatch").join("shell")
    }
}

fn js_string(path: &Path) -> String {
    serde_json::Value::String(path.to_string_lossy().into_owned()).to_string()
}

/// The extension's text for this job.
pub fn guard_js(folder: &AgentFolder, package: &Path, codemode_models: bool) -> String {
    let module = |rel: &str| js_string(&package.join(rel));
    GUARD_TEMPLATE
        .replace("__MCP_MODULE__", &module(INDEX))
        .replace("__CODEMODE_MODULE__", &module(INDEX))
        .replace("__SELF_PATH__", &js_string(&folder.guard()))
        .replace("__REPORT_PATH__", &js_string(&folder.report()))
        .replace("__EXPECTED_PATH__", &js_string(&folder.expected()))
        .replace(
            "__CODEMODE_MODELS__",
            if codemode_models { "true" } else { "false" },
        )
}

/// pi's `settings.json`: the built-in MCP (and, with codemode's models off, the built-in codemode)
/// replaced by the runner's extension; the overlay's extensions and skills added; in a confined
/// job, pi's shell ([`AgentFolder::shell`]).
pub fn settings_json(
    folder: &AgentFolder,
    overlay: Option<&Path>,
    codemode_models: bool,
    shell: Option<&Path>,
) -> String {
    let mut extensions = vec!["-builtin:mcp".to_owned()];
    if !codemode_models {
        extensions.push("-builtin:codemode".to_owned());
    }
    extensions.push(folder.guard().to_string_lossy().into_owned());
    let mut skills = Vec::new();
    if let Some(overlay) = overlay {
        let ext = overlay.join("extensions");
        if ext.is_dir() {
            extensions.push(ext.to_string_lossy().into_owned());
        }
        let sk = overlay.join("skills");
        if sk.is_dir() {
            skills.push(sk.to_string_lossy().into_owned());
        }
    }
    let mut settings = serde_json::json!({
        "extensions": extensions,
        "skills": skills,
    });
    if let Some(shell) = shell {
        settings["shellPath"] = shell.to_string_lossy().into_owned().into();
    }
    format!("{settings:#}\n")
}

/// The `pi` a job's own commands start: the same pi, always without MCP.
pub fn shim(node: &Path, package: &Path) -> String {
    let quote = |p: &Path| format!("'{}'", p.to_string_lossy().replace('\'', r"'\''"));
    format!(
        "#!/bin/sh\n# pi inside a pi-dispatch job: MCP is the job's, so a pi started here gets --no-mcp.\nexec {} {} --no-mcp \"$@\"\n",
        quote(node),
        quote(&package.join(ENTRY))
    )
}

/// The name pi-dispatch answers to as pi's shell (`job-shell`): the job image links it to the
/// runner, in the image's read-only `bin/`, so that no tool of pi's can rewrite what pi runs for
/// each of its commands.
pub const SHELL_NAME: &str = "pi-dispatch-shell";

/// pi's shell for `runner`: the image's link beside it, when there is one.
pub fn image_shell(runner: &Path) -> Option<PathBuf> {
    let link = runner.with_file_name(SHELL_NAME);
    std::fs::symlink_metadata(&link).is_ok().then_some(link)
}

/// pi's shell where the runner has no link beside it: `runner job-shell`, which gives up the
/// capability that keeps pi out of its tools' reach and the hub's token, then runs bash.
pub fn shell_script(runner: &Path) -> String {
    let quote = |p: &Path| format!("'{}'", p.to_string_lossy().replace('\'', r"'\''"));
    format!(
        "#!/bin/sh\n# pi's shell inside a pi-dispatch job: its commands cannot reach into pi.\nexec {} job-shell \"$@\"\n",
        quote(runner)
    )
}

/// The runner's step that prepares pi's private agent folder, before any server connects: pi's
/// settings, the runner's extension, pi's `mcp.json` with no server yet (the serve step writes the
/// hub's). Nothing to write for an agent other than pi.
pub(crate) fn prepare_folder(
    agent_dir: &Path,
    pi: Option<&PiOptions>,
    codemode_models: bool,
    confine: Option<&Path>,
) -> Result<AgentFolder, crate::job_file::Stop> {
    let folder = AgentFolder {
        dir: agent_dir.to_owned(),
    };
    let Some(pi) = pi else {
        return Ok(folder);
    };
    prepare(&folder, pi, codemode_models, confine)
        .and_then(|()| write_private(agent_dir, "mcp.json", b"{\"mcpServers\": {}}\n"))
        .map_err(|e| {
            crate::job_file::Stop::new(
                protocol::reason::Reason::RunnerSetupFailed,
                None,
                format!("pi's agent folder could not be written ({})", e.kind()),
            )
        })?;
    Ok(folder)
}

/// Writes everything pi needs into the private agent folder (pi's `mcp.json` is written by the
/// caller, which knows the hub's endpoints). `runner` is given in a confined job: pi's shell
/// runs through it.
pub fn prepare(
    folder: &AgentFolder,
    pi: &PiOptions,
    codemode_models: bool,
    runner: Option<&Path>,
) -> std::io::Result<()> {
    let own = folder.dir.join("pi-dispatch");
    write_private(
        &own,
        GUARD_FILE,
        guard_js(folder, &pi.package, codemode_models).as_bytes(),
    )?;
    let _ = std::fs::remove_file(folder.report());
    let _ = std::fs::remove_file(folder.expected());
    std::fs::create_dir_all(folder.tools())?;
    let shell = runner.map(|r| image_shell(r).unwrap_or_else(|| folder.shell()));
    write_private(
        &folder.dir,
        "settings.json",
        settings_json(
            folder,
            pi.overlay.as_deref(),
            codemode_models,
            shell.as_deref(),
        )
        .as_bytes(),
    )?;
    // pi's models.json is the model gateway's (`crate::gateway::start_for_pi`).
    for name in ["APPEND_SYSTEM.md"] {
        if let Some(overlay) = &pi.overlay {
            match std::fs::read(overlay.join(name)) {
                Ok(bytes) => write_private(&folder.dir, name, &bytes)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    write_private(&folder.bin(), "pi", shim(&pi.node, &pi.package).as_bytes())?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(
        folder.bin().join("pi"),
        std::fs::Permissions::from_mode(0o700),
    )?;
    if let Some(runner) = runner.filter(|r| image_shell(r).is_none()) {
        write_private(&own, "shell", shell_script(runner).as_bytes())?;
        std::fs::set_permissions(folder.shell(), std::fs::Permissions::from_mode(0o700))?;
    }
    let _ = std::fs::remove_dir_all(folder.compile_cache());
    if let Some(cache) = &pi.compile_cache {
        // Without it pi only compiles its modules itself, as it would by hand the first time.
        let _ = link_compile_cache(cache, &folder.compile_cache(), rustix::process::getuid());
    }
    Ok(())
}

/// Makes `ours` the folder Node's compile cache is read from for user `uid`: Node looks in
/// `ours/VERSION-UID`, so that one entry links to the image's `cache/VERSION`, made at `image
/// install` for whichever user pi runs as. The image is read-only to every job, so what a job's
/// pi loads was compiled by the operator's install and no job can change it for another; what
/// Node would add at pi's exit is not written. Says the folder linked.
pub fn link_compile_cache(
    cache: &Path,
    ours: &Path,
    uid: rustix::process::Uid,
) -> std::io::Result<PathBuf> {
    let mut versions = std::fs::read_dir(cache)?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name());
    let (Some(version), None) = (versions.next(), versions.next()) else {
        return Err(std::io::Error::other("not one cache in the image"));
    };
    std::fs::create_dir_all(ours)?;
    let mut name = version.clone();
    name.push(format!("-{}", uid.as_raw()));
    let link = ours.join(name);
    std::os::unix::fs::symlink(cache.join(&version), &link)?;
    Ok(link)
}

/// pi's arguments (after the Node binary); `exclude` is the trigger's `run.excludeTools`, which pi
/// leaves out of what it offers the model.
pub fn args(pi: &PiOptions, exclude: &[String]) -> Vec<String> {
    let mut args = vec![
        // Node opens its inspector on SIGUSR1, which any process of the job's user could send:
        // an inspector is a way into pi's memory and environment.
        "--disable-sigusr1".to_owned(),
        pi.package.join(ENTRY).to_string_lossy().into_owned(),
        "--mode".to_owned(),
        "json".to_owned(),
        "--no-session".to_owned(),
        "--no-approve".to_owned(),
    ];
    if let Some(model) = &pi.model {
        args.push("--model".to_owned());
        args.push(model.clone());
    }
    if !exclude.is_empty() {
        args.push("--exclude-tools".to_owned());
        args.push(exclude.join(","));
    }
    args
}

/// What the extension reported before ending pi.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct GuardReport {
    pub reason: String,
    pub name: String,
}

/// Reads the extension's report, if it wrote one.
pub fn read_report(folder: &AgentFolder) -> Option<GuardReport> {
    let bytes = std::fs::read(folder.report()).ok()?;
    let report: GuardReport = serde_json::from_slice(&bytes).ok()?;
    // The name goes into the cause on the exit line: only a tool name's characters pass.
    let plain = report.name.len() <= 64
        && report
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-/.".contains(&b));
    let known =
        ["mcp-shadowed", "mcp-unavailable", "mcp-unreachable"].contains(&report.reason.as_str());
    (known && plain).then_some(report)
}

/// `listed.json`: each server with the number of tools the hub lists of it, and when pi's wait
/// for their tools ends (Unix milliseconds): the job's one wait, which began as the runner started
/// connecting (`wait_began`) and lasts `wait` in all, the runner's part and pi's together.
pub fn expected_json(
    servers: &[(String, usize)],
    wait_began: std::time::SystemTime,
    wait: std::time::Duration,
) -> String {
    let servers: serde_json::Map<String, serde_json::Value> = servers
        .iter()
        .map(|(name, count)| (name.clone(), (*count).into()))
        .collect();
    let deadline_ms = (wait_began + wait)
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    format!(
        "{}\n",
        serde_json::json!({"deadlineMs": deadline_ms, "servers": servers})
    )
}

/// Writes a file only the job's user can read, in a folder made for it: whole, then renamed into
/// place, so that pi (which may be reading it already) sees either the old file or the new one.
pub(crate) fn write_private(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    config::files::write_atomic(&dir.join(name), bytes, 0o600)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder() -> AgentFolder {
        AgentFolder {
            dir: PathBuf::from("/home/job/.pi-dispatch/agent"),
        }
    }

    #[test]
    fn the_extension_has_every_constant_filled_in() {
        let js = guard_js(&folder(), Path::new("/opt/pi"), false);
        for placeholder in [
            "__MCP_MODULE__",
            "__CODEMODE_MODULE__",
            "__SELF_PATH__",
            "__REPORT_PATH__",
            "__EXPECTED_PATH__",
            "__CODEMODE_MODELS__",
        ] {
            assert!(
                GUARD_TEMPLATE.contains(placeholder) && !js.contains(placeholder),
                "{placeholder}"
            );
        }
        assert!(
            js.contains(r#"import { createMcpExtension } from "/opt/pi/dist/bundle/index.js""#)
        );
        assert!(
            js.contains(
                r#"import { createCodemodeExtension } from "/opt/pi/dist/bundle/index.js""#
            )
        );
        assert!(js.contains(r#"const SELF = "/home/job/.pi-dispatch/agent/pi-dispatch/mcp.mjs""#));
        assert!(js.contains("const CODEMODE_MODELS = false;"));
        assert!(
            guard_js(&folder(), Path::new("/opt/pi"), true)
                .contains("const CODEMODE_MODELS = true;")
        );
    }

    #[test]
    fn settings_replace_the_builtin_mcp_and_codemode_only_when_models_are_off() {
        let on: serde_json::Value =
            serde_json::from_str(&settings_json(&folder(), None, true, None)).unwrap();
        assert_eq!(
            on["extensions"],
            serde_json::json!([
                "-builtin:mcp",
                "/home/job/.pi-dispatch/agent/pi-dispatch/mcp.mjs"
            ])
        );
        let off: serde_json::Value =
            serde_json::from_str(&settings_json(&folder(), None, false, None)).unwrap();
        assert_eq!(off["extensions"][1], "-builtin:codemode");
        assert!(on.get("shellPath").is_none());
        let shell = Path::new("/opt/i/bin/pi-dispatch-shell");
        let confined: serde_json::Value =
            serde_json::from_str(&settings_json(&folder(), None, true, Some(shell))).unwrap();
        assert_eq!(confined["shellPath"], "/opt/i/bin/pi-dispatch-shell");
        assert!(
            shell_script(Path::new("/opt/i/bin/pi-dispatch"))
                .ends_with("exec '/opt/i/bin/pi-dispatch' job-shell \"$@\"\n")
        );
    }

    #[test]
    fn the_compile_cache_is_linked_under_the_users_name_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("image-cache");
        let ours = dir.path().join("ours");
        let uid = rustix::process::Uid::from_raw(4242);
        // No cache, or two: nothing is linked.
        std::fs::create_dir(&cache).unwrap();
        assert!(link_compile_cache(&cache, &ours, uid).is_err());
        std::fs::create_dir(cache.join("v22.1-x64-aa")).unwrap();
        std::fs::create_dir(cache.join("v22.2-x64-bb")).unwrap();
        assert!(link_compile_cache(&cache, &ours, uid).is_err());
        std::fs::remove_dir(cache.join("v22.2-x64-bb")).unwrap();
        let link = link_compile_cache(&cache, &ours, uid).unwrap();
        assert_eq!(link, ours.join("v22.1-x64-aa-4242"));
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            cache.join("v22.1-x64-aa")
        );
    }

    #[test]
    fn excluded_tools_reach_pis_command_line() {
        let pi = PiOptions {
            node: PathBuf::from("/n"),
            package: PathBuf::from("/p"),
            prompt: PathBuf::from("/job/prompt.md"),
            model: None,
            overlay: None,
            compile_cache: None,
        };
        assert!(!args(&pi, &[]).iter().any(|a| a == "--exclude-tools"));
        let with = args(&pi, &["bash".to_owned(), "mcp__docs__*".to_owned()]);
        assert_eq!(
            with[with.len() - 2..],
            ["--exclude-tools", "bash,mcp__docs__*"]
        );
    }

    #[test]
    fn the_shim_always_adds_no_mcp() {
        let text = shim(Path::new("/opt/node/bin/node"), Path::new("/opt/it's pi"));
        assert!(
            text.ends_with(
                "exec '/opt/node/bin/node' '/opt/it'\\''s pi/dist/bundle/cli.js' --no-mcp \"$@\"\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn pis_wait_ends_with_the_jobs_one_wait() {
        let began = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_000_000);
        let text = expected_json(
            &[("docs".to_owned(), 3)],
            began,
            std::time::Duration::from_secs(15),
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        // The deadline is when the runner began plus the whole wait, not a wait of its own.
        assert_eq!(v["deadlineMs"], 1_015_000);
        assert_eq!(v["servers"]["docs"], 3);
        assert!(v.get("waitMs").is_none());
    }
}
