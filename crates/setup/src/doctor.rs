//! `doctor`: one check a line, each `ok`, `warn` or `fail`, with a fix under each that is not ok.
//!
//! [`gather`] reads what the checks need (the only effects here); [`checks`] is a pure function of
//! that, so every check is tested on values.

use std::path::{Path, PathBuf};

use config::egress::{self, Allowlist, Unreachable};
use config::endpoints::{self, ModelEndpoints};
use config::files::{self, ReadError};
use config::mcp::{self, Overlay, Transport};
use config::models::{self, Models, ModelsError};
use config::settings::Settings;
use config::url::Host;
use serde::Serialize;

use crate::fsutil::{self, Kind};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    /// A hard failure: doctor exits non-zero.
    Fail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What is checked, the same from run to run whatever the outcome, so that scripts and the
    /// panel can refer to it: `area.check`, and `:subject` when the check is made once per server,
    /// trigger, endpoint or setting (`mcp.server-refused:docs`, `admission.trigger:2`).
    pub id: String,
    pub level: Level,
    pub label: String,
    /// What to do about it; every check that is not ok has one.
    pub fix: Option<String>,
    /// The reason a job would be refused for, when the check is the admission's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Check {
    pub fn ok(id: impl Into<String>, label: impl Into<String>) -> Check {
        Check {
            id: id.into(),
            level: Level::Ok,
            label: label.into(),
            fix: None,
            reason: None,
        }
    }

    pub fn warn(id: impl Into<String>, label: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            id: id.into(),
            level: Level::Warn,
            label: label.into(),
            fix: Some(fix.into()),
            reason: None,
        }
    }

    pub fn fail(id: impl Into<String>, label: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            id: id.into(),
            level: Level::Fail,
            label: label.into(),
            fix: Some(fix.into()),
            reason: None,
        }
    }
}

/// A file read for a check: missing, read and parsed, or why not.
#[derive(Debug)]
pub enum Read<T> {
    Missing,
    Parsed(T),
    Failed(String),
}

/// The egress proxy, as doctor reaches it: the one the worker's jobs use (or, when none runs, one
/// doctor starts with the same files and settings), and what doctor proves through it.
pub trait RouteProof {
    /// Whether a proxy answers, and which.
    fn proxy(&self) -> ProxyFound {
        ProxyFound::NotAsked
    }
    /// Through the proxy, as a job: `Ok(())` once anything answers at `host:port` (an https
    /// server closing a plain request included), `Err(why)` when not.
    fn prove(&self, host: &str, port: u16) -> Result<(), String>;
    /// Through the proxy, as a job: `Ok(())` when a host on no list is refused.
    fn canary(&self) -> Result<(), String> {
        Err("not asked".to_owned())
    }
}

/// What doctor found of the egress proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyFound {
    /// Not looked for (unit tests of the other checks).
    NotAsked,
    /// A proxy answers on the control socket: the worker's jobs go through it.
    Running { pid: u32, jobs: usize },
    /// None answers; doctor started one for its own checks (the worker starts its own).
    StartedForDoctor,
    /// None answers and none can be started: why.
    Unavailable(String),
}

/// A proof that is never asked for: nothing is proven and no proxy is looked for.
pub struct NoRouteProof;

impl RouteProof for NoRouteProof {
    fn prove(&self, _host: &str, _port: u16) -> Result<(), String> {
        Err("not proven: doctor did not reach an egress proxy".to_owned())
    }
}

/// Everything the checks look at.
#[derive(Debug)]
pub struct Inputs {
    pub settings: Settings,
    /// What the overlay path is, or why that cannot be told (permission denied, ...).
    pub overlay_kind: Result<Kind, std::io::ErrorKind>,
    /// Whether the deployment folder has a `.env`, and whether the triggers file is there (in any
    /// form: what it holds is `triggers check`'s to judge).
    pub dotenv: bool,
    pub triggers_file: bool,
    pub auth_json: bool,
    pub mcp_auth_json: bool,
    pub mcp: Read<Overlay>,
    pub models: Read<Models>,
    /// The overlay's models.json was read but holds a credential or a command.
    pub models_refused: bool,
    pub allowlist: Read<Allowlist>,
    pub endpoints: Read<ModelEndpoints>,
    /// Whether bubblewrap, the embedded backend's sandbox, is installed.
    pub bwrap: bool,
    /// Whether util-linux's setpriv is installed, when the worker would need it (as root, a job's
    /// sandbox changes to the job's user with it); `None` when it is not needed.
    pub setpriv: Option<bool>,
    /// The default job image: whether its runner is there, and the pi version its labels give.
    pub image_runner: bool,
    pub image_pi_version: Option<String>,
    /// slirp4netns is installed (a job's own network with egress off).
    pub slirp4netns: bool,
    /// A sandbox started the way the worker starts a job's (nested, the image's runner confining a
    /// process in it): `None` when not tried (no bubblewrap or no image), else whether it worked
    /// and, if not, what bubblewrap or the runner said. The caller fills it in (see [`gather`]).
    pub sandbox: Option<Result<(), String>>,
    /// How jobs are kept apart and bounded on this host (bubblewrap backend). The caller fills it
    /// in from what the worker would find (see [`Isolation`]).
    pub isolation: Isolation,
    /// `PI_` names of the environment and `.env` that no part of pi-dispatch (or pi) reads, each
    /// with the setting it probably meant ([`config::settings::unknown_names`]). The caller fills
    /// it in.
    pub unknown_settings: Vec<(String, Option<&'static str>)>,
}

/// How the worker would keep its jobs apart and bounded here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Isolation {
    /// Whether the worker runs as root (doctor runs as the worker's user).
    pub root: bool,
    /// The users, groups and subordinate ranges of the host that claim an id of `PI_JOB_UIDS`.
    pub ids_claimed: Vec<String>,
    /// Whether the worker finds control groups it can make jobs' groups in.
    pub cgroups: bool,
    /// Why the worker cannot give a job a disk of its own (`PI_JOB_DISK_MB`), if it cannot.
    pub no_disk: Option<String>,
}

/// Which entries of the host's `passwd`, `group`, `subuid` and `subgid` (their texts, in that
/// order) claim an id of `range`, named as "user NAME (uid N)" and so on. Pure.
pub fn ids_claimed(range: (u32, u32), files: [&str; 4]) -> Vec<String> {
    let within = |id: u64| (u64::from(range.0)..=u64::from(range.1)).contains(&id);
    let mut out = Vec::new();
    for (text, what) in files.iter().zip(["user", "group"]) {
        for line in text.lines() {
            let fields: Vec<&str> = line.split(':').collect();
            if let (Some(name), Some(Ok(id))) =
                (fields.first(), fields.get(2).map(|f| f.parse::<u64>()))
                && within(id)
            {
                out.push(format!("{what} {name} ({id})"));
            }
        }
    }
    for (text, what) in files[2..].iter().zip(["subuid", "subgid"]) {
        for line in text.lines() {
            let fields: Vec<&str> = line.split(':').collect();
            if let (Some(name), Some(Ok(start)), Some(Ok(count))) = (
                fields.first(),
                fields.get(1).map(|f| f.parse::<u64>()),
                fields.get(2).map(|f| f.parse::<u64>()),
            ) {
                let end = start.saturating_add(count).saturating_sub(1);
                if count > 0 && start <= u64::from(range.1) && end >= u64::from(range.0) {
                    out.push(format!("{what} range of {name} ({start}-{end})"));
                }
            }
        }
    }
    out
}

/// What `isolation_checks` says of how jobs are kept apart and bounded.
fn isolation_checks(inputs: &Inputs, out: &mut Vec<Check>) {
    let s = &inputs.settings;
    let i = &inputs.isolation;
    if !i.root {
        out.push(Check::warn("isolation.root", 
            "the worker is not root: its jobs run as its own user, without ids of their own or bounds, so its other processes can reach them",
            "run the worker as root (the example unit does; docs/sandbox.md)",
        ));
        return;
    }
    let (first, last) = s.job_uids;
    out.push(if i.ids_claimed.is_empty() {
        Check::ok("isolation.job-ids", format!(
            "job ids: each job runs as an id of {first}-{last} (PI_JOB_UIDS), which no user or group of this host has"
        ))
    } else {
        Check::fail("isolation.job-ids", 
            format!(
                "PI_JOB_UIDS ({first}-{last}) holds ids this host gives to others: {}",
                i.ids_claimed.join(", ")
            ),
            "set PI_JOB_UIDS to a range that no user, group or subordinate range of this host uses",
        )
    });
    out.push(if i.cgroups {
        Check::ok("isolation.job-bounds", format!(
            "job bounds: {} processes, {} MiB of memory, {} s of CPU time (PI_JOB_PIDS, PI_JOB_MEMORY_MB, PI_JOB_CPU_SECS)",
            s.job_pids,
            s.job_memory_bytes >> 20,
            s.job_cpu_secs
        ))
    } else {
        Check::warn("isolation.job-bounds", 
            "no control groups the worker can make: jobs run without PI_JOB_PIDS, PI_JOB_MEMORY_MB and PI_JOB_CPU_SECS",
            "give the worker cgroup v1's pids and memory hierarchies, or a delegated cgroup v2 group (Delegate=yes; docs/sandbox.md)",
        )
    });
    out.push(match &i.no_disk {
        None => Check::ok("isolation.job-disk", format!(
            "job disk: each job writes at most {} MiB, on a disk of its own (PI_JOB_DISK_MB)",
            s.job_disk_bytes >> 20
        )),
        Some(why) => Check::warn("isolation.job-disk", 
            format!("{why}: jobs write to their workspace without PI_JOB_DISK_MB"),
            "install e2fsprogs and give the worker loop devices (/dev/loop-control; docs/sandbox.md)",
        ),
    });
}

/// The container backend: the engine, and the job image (the engine's, or the folder over a base).
fn podman_checks(inputs: &Inputs, base: Option<&str>, out: &mut Vec<Check>) {
    let image = inputs
        .settings
        .job_image
        .as_deref()
        .unwrap_or(config::settings::DEFAULT_JOB_IMAGE);
    let engine = inputs.settings.sandbox.engine_or_podman();
    out.push(if is_executable(Path::new(engine)) {
        Check::ok("sandbox.engine", format!("container engine: {engine} (PI_SANDBOX)"))
    } else {
        Check::fail("sandbox.engine", 
            format!("PI_SANDBOX names a container engine, and {engine} is not installed: no job can start"),
            "install Debian's podman and runc packages (or Docker, for PI_SANDBOX=docker)",
        )
    });
    let (installed, how) = match base {
        None => (
            inputs.image_runner,
            format!(
                "`pi-dispatch image build {image}` (the container image {})",
                protocol::image::container_ref(image)
            ),
        ),
        Some(_) => (
            inputs.image_runner,
            format!(
                "`pi-dispatch image install {image}` (its folder is bound over PI_PODMAN_IMAGE)"
            ),
        ),
    };
    out.push(match (installed, &inputs.image_pi_version) {
        (true, Some(v)) => Check::ok("image", format!("job image {image}: pi {v}")),
        (true, None) => Check::warn("image", 
            format!("job image {image} declares no pi version"),
            format!("make it again: {how}"),
        ),
        (false, _) => Check {
            reason: Some("job-image-missing".to_owned()),
            ..Check::fail("image", 
                format!(
                    "job image {image} is not there: jobs that use it are refused (job-image-missing)"
                ),
                how,
            )
        },
    });
}

/// Where the embedded backend expects bubblewrap, and (for a root worker) setpriv.
pub use crate::image::BWRAP;
pub const SETPRIV: &str = "/usr/bin/setpriv";

/// Reads what the checks need. Never follows a link.
pub fn gather(settings: Settings) -> Inputs {
    let overlay = read_overlay(&settings.overlay_dir);
    let image = read_image(&settings);
    let exists = |path: &Path| fsutil::kind(path).is_ok_and(|k| k != Kind::Missing);
    Inputs {
        dotenv: exists(&settings.dir.join(".env")),
        triggers_file: exists(&settings.triggers_file),
        bwrap: is_executable(Path::new(BWRAP)),
        slirp4netns: is_executable(Path::new(protocol::egress::SLIRP4NETNS)),
        setpriv: rustix::process::geteuid()
            .is_root()
            .then(|| is_executable(Path::new(SETPRIV))),
        image_runner: image.runner,
        image_pi_version: image.pi_version,
        sandbox: None,
        isolation: Isolation::default(),
        unknown_settings: Vec::new(),
        auth_json: overlay.auth_json,
        mcp_auth_json: overlay.mcp_auth_json,
        allowlist: read(&settings.egress_allowlist, |b| {
            let text = std::str::from_utf8(b).map_err(|_| "it is not UTF-8 text".to_owned())?;
            egress::parse_allowlist(text).map_err(|e| e.to_string())
        }),
        endpoints: read(&settings.model_endpoints, |b| {
            let text = std::str::from_utf8(b).map_err(|_| "it is not UTF-8 text".to_owned())?;
            endpoints::parse_model_endpoints(text).map_err(|e| e.to_string())
        }),
        settings,
        overlay_kind: overlay.kind,
        mcp: overlay.mcp,
        models: overlay.models,
        models_refused: overlay.models_refused,
    }
}

/// What [`gather`] read of the overlay folder.
struct OverlayRead {
    kind: Result<Kind, std::io::ErrorKind>,
    mcp: Read<Overlay>,
    models: Read<Models>,
    models_refused: bool,
    auth_json: bool,
    mcp_auth_json: bool,
}

/// Reads the overlay's `mcp.json` and `models.json` and looks for its credential files; nothing
/// of it when the overlay is not a folder.
fn read_overlay(overlay: &Path) -> OverlayRead {
    let kind = fsutil::kind(overlay).map_err(|e| e.kind());
    let readable = kind == Ok(Kind::Dir);
    let present = |name: &str| {
        readable && fsutil::kind(&overlay.join(name)).is_ok_and(|k| k != Kind::Missing)
    };
    let mcp = if readable {
        read(&overlay.join("mcp.json"), |b| {
            mcp::parse_overlay(b).map_err(|e| format!("{e} [{}]", e.code()))
        })
    } else {
        Read::Missing
    };
    let mut models_refused = false;
    let models = if readable {
        read(&overlay.join("models.json"), |b| {
            models::check(b).map_err(|e: ModelsError| {
                models_refused = matches!(e, ModelsError::Refused(_));
                e.to_string()
            })
        })
    } else {
        Read::Missing
    };
    OverlayRead {
        kind,
        mcp,
        models,
        models_refused,
        auth_json: present("auth.json"),
        mcp_auth_json: present("mcp-auth.json"),
    }
}

/// What [`gather`] read of the job image: whether its runner is there, and its pi version.
struct ImageRead {
    runner: bool,
    pi_version: Option<String>,
}

/// Reads the job image: the engine's labels for the container backend's own images, else the
/// image folder's runner and `image.json`.
fn read_image(settings: &Settings) -> ImageRead {
    let image_name = settings
        .job_image
        .clone()
        .unwrap_or_else(|| config::settings::DEFAULT_JOB_IMAGE.to_owned());
    // The container backend's own images are the engine's: their labels, from it.
    if matches!(
        settings.sandbox,
        config::settings::SandboxBackend::Podman { base: None, .. }
    ) {
        let engine = Path::new(settings.sandbox.engine_or_podman());
        let labels = pickup::fs::engine_labels(engine, &image_name)
            .ok()
            .flatten();
        return ImageRead {
            runner: labels.is_some(),
            pi_version: labels.as_ref().and_then(|l| {
                l[protocol::image::PI_VERSION_LABEL]
                    .as_str()
                    .map(str::to_owned)
            }),
        };
    }
    let image = settings.dir.join("images").join(&image_name);
    ImageRead {
        runner: is_executable(&image.join(crate::image::RUNNER)),
        pi_version: std::fs::read(image.join("image.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| {
                v["labels"]["dev.pi-dispatch.pi-version"]
                    .as_str()
                    .map(str::to_owned)
            }),
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn read<T>(path: &Path, mut parse: impl FnMut(&[u8]) -> Result<T, String>) -> Read<T> {
    match files::read_file(path, mcp::MAX_FILE_BYTES) {
        Ok(bytes) => match parse(&bytes) {
            Ok(v) => Read::Parsed(v),
            Err(why) => Read::Failed(why),
        },
        Err(ReadError::Missing) => Read::Missing,
        Err(e) => Read::Failed(format!("it {e}")),
    }
}

/// The path of the overlay's `mcp-auth.json`, the one file `--fix` may delete.
pub fn mcp_auth_path(settings: &Settings) -> PathBuf {
    settings.overlay_dir.join("mcp-auth.json")
}

/// The checks when the settings themselves cannot be resolved: one failure each, and nothing else
/// can be checked until they are fixed.
pub fn settings_failed(errors: &[String], dir: &Path) -> Vec<Check> {
    errors
        .iter()
        .enumerate()
        .map(|(i, e)| {
            Check::fail(
                format!("settings.error:{i}"),
                format!("settings: {e}"),
                format!(
                    "correct it in {}/.env or in the environment; nothing else is checked until the settings read",
                    dir.display()
                ),
            )
        })
        .collect()
}

/// Every check, in the order doctor prints them.
pub fn checks(inputs: &Inputs, proof: &dyn RouteProof) -> Vec<Check> {
    let mut out = Vec::new();
    if inputs.unknown_settings.is_empty() {
        out.push(Check::ok(
            "settings",
            "settings: the environment and .env read cleanly",
        ));
    }
    for (name, meant) in &inputs.unknown_settings {
        let meant = meant.map_or(String::new(), |m| format!(" (did you mean {m}?)"));
        out.push(Check::warn(
            format!("settings.unknown:{name}"),
            format!("settings: {name} is not a setting pi-dispatch reads{meant}; it is ignored"),
            "rename or remove it in .env or the environment",
        ));
    }
    if !deployment_checks(inputs, &mut out) {
        return out;
    }
    if !overlay_folder_check(inputs, &mut out) {
        return out;
    }
    overlay_credential_checks(inputs, &mut out);
    mcp_checks(inputs, &mut out);
    models_check(inputs, &mut out);
    egress_checks(inputs, proof, &mut out);
    runtime_checks(inputs, &mut out);
    out
}

/// The overlay folder's check: false when it is not a folder, and nothing in it can be checked.
fn overlay_folder_check(inputs: &Inputs, out: &mut Vec<Check>) -> bool {
    let overlay = inputs.settings.overlay_dir.display();
    match inputs.overlay_kind {
        Ok(Kind::Dir) => out.push(Check::ok(
            "overlay.folder",
            format!("overlay folder: {overlay}"),
        )),
        Ok(Kind::Missing) => {
            out.push(Check::warn("overlay.folder", 
                format!(
                    "overlay folder {overlay} does not exist: only jobs that name no server but forge can run"
                ),
                "run `pi-dispatch init`, then `pi-dispatch import-pi`",
            ));
            return false;
        }
        Err(kind) => {
            out.push(Check::fail(
                "overlay.folder",
                format!("overlay folder {overlay} cannot be checked ({kind})"),
                "make the overlay folder readable by the user that runs pi-dispatch",
            ));
            return false;
        }
        Ok(Kind::Link) => {
            out.push(Check::fail("overlay.folder", 
                format!("overlay folder {overlay} is a link"),
                "set PI_GLOBAL_PI_DIR to the real folder: the overlay is mounted into jobs, and a link could point anywhere",
            ));
            return false;
        }
        Ok(Kind::File | Kind::Other) => {
            out.push(Check::fail(
                "overlay.folder",
                format!("overlay folder {overlay} is not a folder"),
                "set PI_GLOBAL_PI_DIR to a folder (`pi-dispatch init` makes one)",
            ));
            return false;
        }
    }
    true
}

/// The overlay holds none of pi's stored credentials (`auth.json`, `mcp-auth.json`).
fn overlay_credential_checks(inputs: &Inputs, out: &mut Vec<Check>) {
    let overlay = inputs.settings.overlay_dir.display();
    out.push(if inputs.auth_json {
        Check::fail(
            "overlay.auth-json",
            "auth.json is in the overlay: every job could read pi's stored credentials",
            format!("delete {overlay}/auth.json; jobs get their provider key from the worker"),
        )
    } else {
        Check::ok("overlay.auth-json", "no auth.json in the overlay")
    });
    out.push(if inputs.mcp_auth_json {
        Check::fail("overlay.mcp-auth-json", 
            "mcp-auth.json is in the overlay: every job could read pi's MCP sign-in tokens",
            format!(
                "delete {overlay}/mcp-auth.json (`pi-dispatch doctor --fix` asks before deleting it); give servers a token in a header instead"
            ),
        )
    } else {
        Check::ok("overlay.mcp-auth-json", "no mcp-auth.json in the overlay")
    });
}

/// Whether the folder holds any of a deployment's files (when it holds none, doctor checks nothing
/// but that).
pub fn is_deployment(inputs: &Inputs) -> bool {
    inputs.dotenv || inputs.triggers_file || inputs.overlay_kind != Ok(Kind::Missing)
}

/// Whether the folder is a deployment: a failure, and `false` (nothing else to check), when it has
/// none of a deployment's files; a warning for each of `.env` and the triggers file it lacks. A
/// missing overlay folder is the overlay check's to report.
fn deployment_checks(inputs: &Inputs, out: &mut Vec<Check>) -> bool {
    let s = &inputs.settings;
    let dir = s.dir.display();
    let triggers = s.triggers_file.display();
    let init = format!("`pi-dispatch init {dir}`");
    if !is_deployment(inputs) {
        out.push(Check::fail("deployment", 
            format!(
                "{dir} is not a pi-dispatch deployment: it has no .env, no triggers file ({triggers}) and no overlay folder ({})",
                s.overlay_dir.display()
            ),
            format!(
                "run {init} to make one there, or run doctor in the deployment's folder (or name it with --dir)"
            ),
        ));
        return false;
    }
    if !inputs.dotenv {
        out.push(Check::warn(
            "deployment.env-file",
            format!("no .env in {dir}: every setting is the environment's or its default"),
            format!(
                "{init} writes one with every setting explained (it only adds what is missing)"
            ),
        ));
    }
    if !inputs.triggers_file {
        out.push(Check::warn("deployment.triggers-file", 
            format!("the triggers file {triggers} does not exist: the worker has no trigger to run"),
            format!(
                "{init} writes an empty one (or set PI_TRIGGERS_FILE); add triggers and check them with `pi-dispatch triggers check`"
            ),
        ));
    }
    true
}

/// What running jobs on this machine needs: bubblewrap (or Podman) and the job image.
fn runtime_checks(inputs: &Inputs, out: &mut Vec<Check>) {
    let s = &inputs.settings;
    if let config::settings::SandboxBackend::Podman { base, .. } = &s.sandbox {
        podman_checks(inputs, base.as_deref(), out);
        return;
    }
    out.push(if inputs.bwrap {
        match &inputs.sandbox {
            None => Check::ok("sandbox.bubblewrap", format!("bubblewrap: {BWRAP}")),
            Some(Ok(())) => Check::ok("sandbox.bubblewrap", format!(
                "bubblewrap: {BWRAP}, a job's sandbox starts and confines its processes"
            )),
            Some(Err(why)) => Check {
                reason: Some("container-never-started".to_owned()),
                ..Check::fail("sandbox.bubblewrap", 
                    format!(
                        "bubblewrap is installed but a job's sandbox does not start: {why} (every job would end container-never-started)"
                    ),
                    "run doctor as the worker's user where the worker runs; a job's sandbox needs user namespaces (sysctl user.max_user_namespaces above 0), no seccomp profile that forbids unshare or mount, and, for a root worker, the job's users (nobody and the repositories' owners) mapped in its user namespace",
                )
            },
        }
    } else {
        Check::fail("sandbox.bubblewrap", 
            format!("bubblewrap is not installed ({BWRAP}): no job can start"),
            "install Debian's bubblewrap package (scripts/install does)",
        )
    });
    isolation_checks(inputs, out);
    if inputs.setpriv == Some(false) {
        out.push(Check::fail(
            "sandbox.setpriv",
            format!("setpriv is not installed ({SETPRIV}): a root worker starts no job"),
            "install Debian's util-linux package",
        ));
    }
    let image = s
        .job_image
        .as_deref()
        .unwrap_or(config::settings::DEFAULT_JOB_IMAGE);
    out.push(match (inputs.image_runner, &inputs.image_pi_version) {
        (true, Some(v)) => Check::ok("image", format!("job image {image}: pi {v}")),
        (true, None) => Check::warn("image", 
            format!("job image {image} has no pi version in its image.json"),
            format!("rebuild it: `pi-dispatch image install {image}`"),
        ),
        (false, _) => Check {
            reason: Some("job-image-missing".to_owned()),
            ..Check::fail("image", 
                format!(
                    "job image {image} is not installed: jobs that use it are refused (job-image-missing)"
                ),
                format!("`pi-dispatch image install {image}`"),
            )
        },
    });
}

fn mcp_checks(inputs: &Inputs, out: &mut Vec<Check>) {
    let Some(overlay) = mcp_file_check(&inputs.mcp, out) else {
        return;
    };
    mcp_switch_checks(overlay, out);
    server_refused_checks(overlay, out);
    server_warning_checks(overlay, out);
}

/// Whether `mcp.json` reads, with the servers it offers; the overlay when it does.
fn mcp_file_check<'a>(mcp: &'a Read<Overlay>, out: &mut Vec<Check>) -> Option<&'a Overlay> {
    let overlay = match mcp {
        Read::Missing => {
            out.push(Check::ok(
                "mcp.file",
                "mcp.json: none in the overlay, so jobs connect no MCP server (forge needs none)",
            ));
            return None;
        }
        Read::Failed(why) => {
            out.push(Check::fail("mcp.file", 
                format!("mcp.json cannot be read: {why}"),
                "fix the file (`pi-dispatch mcp check` shows details) or run `pi-dispatch import-pi` again; until then every job that names a server is refused",
            ));
            return None;
        }
        Read::Parsed(o) => o,
    };
    let offered: Vec<&str> = overlay
        .servers
        .iter()
        .filter(|s| s.offered().is_some())
        .map(|s| s.name.as_str())
        .collect();
    out.push(Check::ok(
        "mcp.file",
        format!(
            "mcp.json reads: {} offered{}",
            plural(offered.len(), "server"),
            list(&offered)
        ),
    ));
    Some(overlay)
}

/// What the overlay turns off: servers, and codemode's models.
fn mcp_switch_checks(overlay: &Overlay, out: &mut Vec<Check>) {
    let off: Vec<&str> = overlay
        .servers
        .iter()
        .filter(|s| s.verdict.is_ok() && !s.enabled)
        .map(|s| s.name.as_str())
        .collect();
    if !off.is_empty() {
        out.push(Check::ok(
            "mcp.turned-off",
            format!("turned off (not offered): {}", off.join(", ")),
        ));
    }
    if !overlay.codemode_models {
        out.push(Check::ok(
            "mcp.codemode-models",
            "codemodeModels is false: codemode scripts cannot call models in any job",
        ));
    }
}

/// A warning for each server the overlay refuses, with its problems as the fix.
fn server_refused_checks(overlay: &Overlay, out: &mut Vec<Check>) {
    for entry in &overlay.servers {
        if entry.problems().is_empty() {
            continue;
        }
        let fix: Vec<String> = entry.problems().iter().map(ToString::to_string).collect();
        out.push(Check::warn(
            format!("mcp.server-refused:{}", shown(&entry.name)),
            format!(
                "server {} is refused: a job that names it is refused",
                shown(&entry.name)
            ),
            fix.join("\n"),
        ));
    }
}

/// The offered servers' warnings: a package runner, and each warning of the server's own.
fn server_warning_checks(overlay: &Overlay, out: &mut Vec<Check>) {
    for server in overlay.servers.iter().filter_map(|s| s.offered()) {
        if let Some(runner) = server.package_runner() {
            out.push(Check::warn(format!("mcp.package-runner:{}", server.name), 
                format!(
                    "server {} uses the package runner {runner}: it downloads the server at every job start, at whatever version the registry serves",
                    server.name
                ),
                "install the server in the job image or the overlay and name its command; if you keep the runner, allowlist the registry it fetches from",
            ));
        }
        for w in server.warnings() {
            out.push(Check::warn(
                format!("mcp.server-warning:{}:{}", server.name, w.code),
                format!("server {}: {} [{}]", server.name, w.message, w.code),
                w.fix,
            ));
        }
    }
}

fn models_check(inputs: &Inputs, out: &mut Vec<Check>) {
    match &inputs.models {
        Read::Missing => {}
        Read::Parsed(_) => out.push(Check::ok("models.file", "models.json in the overlay holds no credential")),
        Read::Failed(why) if inputs.models_refused => out.push(Check::fail("models.file", 
            format!("models.json in the overlay: {why}"),
            "write each key as $NAME (a variable the job is given), or run `pi-dispatch import-pi` from a host file that does",
        )),
        Read::Failed(why) => out.push(Check::fail("models.file", 
            format!("models.json in the overlay cannot be read: {why}"),
            "make it plain JSON, not a link (pi-dispatch reads it strictly), or run `pi-dispatch import-pi` again",
        )),
    }
}

/// The proxy itself: answering, and refusing a host on no list.
fn proxy_checks(proof: &dyn RouteProof, out: &mut Vec<Check>) {
    match proof.proxy() {
        ProxyFound::NotAsked => return,
        ProxyFound::Running { pid, jobs } => out.push(Check::ok("egress.proxy", format!(
            "egress proxy: running (pid {pid}, {} open)",
            plural(jobs, "job")
        ))),
        ProxyFound::StartedForDoctor => out.push(Check::ok("egress.proxy", 
            "egress proxy: none running (the worker starts its own); doctor checked with one of its own on the same files",
        )),
        ProxyFound::Unavailable(why) => {
            out.push(Check::fail("egress.proxy", 
                format!("egress proxy: none answers and none can be started ({why}): jobs with egress on cannot run"),
                "run `pi-dispatch egress-proxy` in the foreground to see why it stops, or set PI_EGRESS=0",
            ));
            return;
        }
    }
    out.push(match proof.canary() {
        Ok(()) => Check::ok("egress.proxy-refuses", "egress proxy: a host on no list is refused"),
        Err(why) => Check::fail("egress.proxy-refuses", 
            format!("egress proxy: a host on no list was not refused ({why})"),
            "stop the process that answers on the egress control socket: it is not pi-dispatch's proxy, or not this version's",
        ),
    });
}

fn egress_checks(inputs: &Inputs, proof: &dyn RouteProof, out: &mut Vec<Check>) {
    let s = &inputs.settings;
    let allowlist = allowlist_check(inputs, out);
    let declared = endpoints_check(inputs, out);
    if !s.egress {
        out.push(Check::warn("egress.policy", 
            "egress policy off (PI_EGRESS=0): jobs can reach any host but this one",
            "set PI_EGRESS=1 (or leave it empty) so that jobs reach only the allowlisted hosts and declared endpoints, through the egress proxy",
        ));
        out.push(egress_off_check(inputs));
        return;
    }
    proxy_checks(proof, out);
    if let Some(declared) = declared {
        local_endpoint_checks(declared, out);
    }
    let (Read::Parsed(overlay), Some(allowlist), Some(declared)) =
        (&inputs.mcp, allowlist, declared)
    else {
        return;
    };
    let mut routes = ServerRoutes {
        inputs,
        allowlist,
        declared,
        model_hosts: model_host_ports(&inputs.models),
        proof,
        proven: Vec::new(),
    };
    for server in overlay.servers.iter().filter_map(|s| s.offered()) {
        if let Some(check) = routes.check(server) {
            out.push(check);
        }
    }
}

/// Whether the egress allowlist reads (a failure when it is missing and the policy is on); the
/// list when it does.
fn allowlist_check<'a>(inputs: &'a Inputs, out: &mut Vec<Check>) -> Option<&'a Allowlist> {
    let s = &inputs.settings;
    let allow_file = s.egress_allowlist.display();
    match &inputs.allowlist {
        Read::Parsed(a) => {
            out.push(Check::ok(
                "egress.allowlist",
                format!(
                    "{} reads: {}",
                    file_name(&s.egress_allowlist),
                    plural(a.len(), "host")
                ),
            ));
            Some(a)
        }
        Read::Missing if s.egress => {
            out.push(Check::fail(
                "egress.allowlist",
                format!("{allow_file} does not exist, and the egress policy is on"),
                "run `pi-dispatch init` to write it, then add one host a line",
            ));
            None
        }
        Read::Missing => None,
        Read::Failed(why) => {
            out.push(Check::fail("egress.allowlist", 
                format!("{} cannot be read: {why}", file_name(&s.egress_allowlist)),
                format!("fix {allow_file}: one bare host a line, '#' comments, a leading '.' for subdomains"),
            ));
            None
        }
    }
}

/// Whether the model endpoints file reads (none is none declared); the endpoints when it does.
fn endpoints_check<'a>(inputs: &'a Inputs, out: &mut Vec<Check>) -> Option<&'a ModelEndpoints> {
    let s = &inputs.settings;
    match &inputs.endpoints {
        Read::Parsed(e) => {
            out.push(Check::ok(
                "egress.endpoints",
                format!(
                    "{} reads: {} declared",
                    file_name(&s.model_endpoints),
                    plural(e.endpoints.len(), "endpoint")
                ),
            ));
            Some(e)
        }
        Read::Missing => {
            out.push(Check::ok(
                "egress.endpoints",
                format!(
                    "{}: none, so no model endpoints are declared",
                    file_name(&s.model_endpoints)
                ),
            ));
            Some(&EMPTY)
        }
        Read::Failed(why) => {
            out.push(Check::fail(
                "egress.endpoints",
                format!("{} cannot be read: {why}", file_name(&s.model_endpoints)),
                format!(
                    "fix {} (`pi-dispatch init` writes an empty one)",
                    s.model_endpoints.display()
                ),
            ));
            None
        }
    }
}

/// A note for each declared endpoint on this machine: jobs reach that port of it.
fn local_endpoint_checks(declared: &ModelEndpoints, out: &mut Vec<Check>) {
    for e in &declared.endpoints {
        if config::url::is_loopback(&e.host) {
            out.push(Check::ok(format!("egress.local-endpoint:{}", e.id), format!(
                "declared endpoint {} is on this machine ({}:{}): jobs reach that port of it and nothing else here",
                e.id, e.host, e.port
            )));
        }
    }
}

/// The routes of the overlay's HTTP servers through the egress proxy, each host and port proven
/// once.
struct ServerRoutes<'a> {
    inputs: &'a Inputs,
    allowlist: &'a Allowlist,
    declared: &'a ModelEndpoints,
    /// The models' own hosts and ports: a server on one is not proven again.
    model_hosts: Vec<(Host, u16)>,
    proof: &'a dyn RouteProof,
    proven: Vec<((String, u16), Result<(), String>)>,
}

impl ServerRoutes<'_> {
    /// The check of one offered server's route, if it has one to report (an HTTP server that is
    /// not allowlisted and not on a model's endpoint).
    fn check(&mut self, server: &config::mcp::McpServer) -> Option<Check> {
        let Transport::Http(http) = &server.transport else {
            return None;
        };
        let url = &http.url;
        let (host, port) = (url.host().to_string(), url.port());
        match egress::route(
            url.scheme(),
            url.host(),
            port,
            self.allowlist,
            self.declared,
        ) {
            Ok(egress::Route::Allowlisted) => None,
            Ok(egress::Route::DeclaredEndpoint { id }) => {
                if self.model_hosts.contains(&(url.host().clone(), port)) {
                    return None;
                }
                Some(match self.prove(&host, port) {
                    Ok(()) => Check::ok(
                        format!("egress.server-route:{}", server.name),
                        format!(
                            "server {}: the route to declared endpoint {id} ({host}:{port}) is proven",
                            server.name
                        ),
                    ),
                    Err(why) => Check::warn(
                        format!("egress.server-route:{}", server.name),
                        format!(
                            "server {} is on declared endpoint {id} ({host}:{port}), which no overlay model uses: {why}",
                            server.name
                        ),
                        "check that the server runs and listens on that host and port, as seen from this machine",
                    ),
                })
            }
            Err(why) => Some(self.unreachable(server, url, why)),
        }
    }

    /// The proof of the route to `host:port`, asked once for each.
    fn prove(&mut self, host: &str, port: u16) -> Result<(), String> {
        let key = (host.to_owned(), port);
        if let Some((_, r)) = self.proven.iter().find(|(k, _)| *k == key) {
            return r.clone();
        }
        let r = self.proof.prove(host, port);
        self.proven.push((key, r.clone()));
        r
    }

    /// The warning for a server out of the proxy's reach, with what would bring it in.
    fn unreachable(
        &self,
        server: &config::mcp::McpServer,
        url: &config::url::PlainUrl,
        why: Unreachable,
    ) -> Check {
        let s = &self.inputs.settings;
        let (host, port) = (url.host().to_string(), url.port());
        let fix = if url.scheme() == config::url::Scheme::Http
            && why == Unreachable::NotAllowed
            && self.allowlist.names(url.host())
        {
            format!(
                "use the server's https:// url: {host} is allowlisted, for https on port 443 only"
            )
        } else {
            reach_fix(
                why,
                &host,
                port,
                &s.egress_allowlist.display().to_string(),
                &s.model_endpoints.display().to_string(),
            )
        };
        Check::warn(
            format!("egress.server-route:{}", server.name),
            format!(
                "server {} is out of the egress proxy's reach ({host} on port {port}): {}",
                server.name,
                reach_reason(why)
            ),
            fix,
        )
    }
}

static EMPTY: ModelEndpoints = ModelEndpoints {
    endpoints: Vec::new(),
};

fn reach_reason(why: Unreachable) -> &'static str {
    match why {
        Unreachable::PlainHttpOn443 => "an http:// url on port 443 is never let through",
        Unreachable::Loopback => "the proxy never lets a job reach its own machine",
        Unreachable::NotAllowed => {
            "neither allowlisted for https on port 443 nor a declared endpoint"
        }
    }
}

fn reach_fix(
    why: Unreachable,
    host: &str,
    port: u16,
    allow_file: &str,
    endpoints_file: &str,
) -> String {
    match why {
        Unreachable::PlainHttpOn443 => "use the server's https:// url".to_owned(),
        Unreachable::Loopback => {
            "a server on this machine cannot be reached from a job; run it in the job (stdio) or on another host".to_owned()
        }
        Unreachable::NotAllowed if port == 443 => format!(
            "add {host} to {allow_file}, or declare {host} port {port} in {endpoints_file}"
        ),
        Unreachable::NotAllowed => format!(
            "declare {host} port {port} in {endpoints_file} (the allowlist covers port 443 only)"
        ),
    }
}

/// The host and port of every model `baseUrl` in the overlay's models.json that names one, in the
/// plain form the egress rule compares (`HTTPS://Host:443/v1` is `host` on 443).
fn model_host_ports(models: &Read<Models>) -> Vec<(Host, u16)> {
    let Read::Parsed(models) = models else {
        return Vec::new();
    };
    models
        .base_urls
        .iter()
        .filter_map(|u| config::url::host_port(u))
        .collect()
}

/// A file's name, for labels (the fix gives the whole path).
fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn list(names: &[&str]) -> String {
    if names.is_empty() {
        String::new()
    } else {
        format!(" ({})", names.join(", "))
    }
}

/// A server name as written when it is a plain key, else a neutral word.
fn shown(name: &str) -> String {
    match config::problem::printable_key(name) {
        Some(n) => n.to_owned(),
        None => "(a server whose name is not plain)".to_owned(),
    }
}

#[cfg(test)]
#[path = "doctor_tests.rs"]
mod tests;

/// With egress off, whether a job can have the network it gets: its own namespace, through
/// slirp4netns, which only a root worker makes (the worker refuses to start such a job otherwise).
fn egress_off_check(inputs: &Inputs) -> Check {
    let id = "egress.off-network";
    if !inputs.slirp4netns {
        return Check::fail(
            id,
            format!(
                "egress off: {} is not installed, so no job can start",
                protocol::egress::SLIRP4NETNS
            ),
            "install Debian's slirp4netns, or turn the egress policy on (remove PI_EGRESS=0)",
        );
    }
    if !inputs.isolation.root {
        return Check::fail(
            id,
            "egress off: a job's network of its own is made by a worker running as root, so no job can start under this user",
            "run the worker as root, or turn the egress policy on (remove PI_EGRESS=0)",
        );
    }
    Check::ok(
        id,
        "egress off: each job gets a network of its own through slirp4netns: the outside over IPv4, never this host's loopback or addresses",
    )
}
