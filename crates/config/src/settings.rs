//! Deployment settings: the process environment over the deployment folder's `.env`.
//!
//! Every command resolves its settings here, so each setting has one meaning everywhere. A bad value
//! is an error naming the setting, never quoting the value.

use std::path::{Path, PathBuf};

use crate::dotenv::Dotenv;

/// Where the overlay folder is when `PI_GLOBAL_PI_DIR` is not set.
pub const DEFAULT_OVERLAY_DIR: &str = "pi-global";

/// The setting that names the overlay folder.
pub const OVERLAY_SETTING: &str = "PI_GLOBAL_PI_DIR";
pub const TRIGGERS_SETTING: &str = "PI_TRIGGERS_FILE";
pub const EGRESS_SETTING: &str = "PI_EGRESS";
pub const FORWARD_ENV_SETTING: &str = "PI_FORWARD_ENV";
pub const ALLOWLIST_SETTING: &str = "PI_EGRESS_ALLOWLIST";
pub const ENDPOINTS_SETTING: &str = "PI_MODEL_ENDPOINTS";
pub const REGISTRIES_SETTING: &str = "PI_PACKAGE_REGISTRIES";
pub const JOB_IMAGE_SETTING: &str = "PI_JOB_IMAGE";
/// The image of jobs when neither their trigger nor `PI_JOB_IMAGE` names one (what
/// `pi-dispatch image install` builds by default).
pub const DEFAULT_JOB_IMAGE: &str = "pi-job";
pub const GITLAB_URL_SETTING: &str = "GITLAB_URL";
pub const PROVIDER_SETTING: &str = "PI_PROVIDER";
pub const MODEL_SETTING: &str = "PI_MODEL";
pub const ON_FAILURE_SETTING: &str = "PI_ON_FAILURE";
pub const CONCURRENCY_SETTING: &str = "PI_WORKER_CONCURRENCY";
pub const TIME_LIMIT_SETTING: &str = "PI_JOB_TIME_LIMIT";
pub const DRAIN_LIMIT_SETTING: &str = "PI_WORKER_DRAIN_LIMIT";
/// The labels a worker takes jobs for (`gpu, zone:eu`), beside its host's own `host:NAME`.
pub const WORKER_LABELS_SETTING: &str = "PI_WORKER_LABELS";
/// This host's name in the queue: the host a local job queued here belongs to, and a worker's
/// `host:NAME` label (else the system's host name, lowercased).
pub const HOST_NAME_SETTING: &str = "PI_HOST_NAME";
/// How often a worker tells the queue it is alive, in seconds; one unseen for three of them is
/// shown as gone.
pub const HEARTBEAT_SETTING: &str = "PI_WORKER_HEARTBEAT_SECS";
pub const DEFAULT_HEARTBEAT_SECS: u64 = 10;
pub const MAX_HEARTBEAT_SECS: u64 = 300;
pub const TRANSCRIPTS_SETTING: &str = "PI_TRANSCRIPTS";
pub const NAMESERVER_SETTING: &str = "PI_EGRESS_NAMESERVER";
pub const PROXY_DIR_SETTING: &str = "PI_EGRESS_PROXY_DIR";
/// The GitHub API a github job's worker talks to (GitHub Enterprise: `https://HOST/api/v3`).
pub const GITHUB_API_URL_SETTING: &str = "PI_GITHUB_API_URL";
pub const DEFAULT_GITHUB_API_URL: &str = "https://api.github.com";
/// Where GitHub repositories are cloned from: `{PI_GITHUB_URL}/OWNER/NAME.git`.
pub const GITHUB_URL_SETTING: &str = "PI_GITHUB_URL";
pub const DEFAULT_GITHUB_URL: &str = "https://github.com";
/// The GitHub App the worker mints installation tokens as: its id, and its private key's file.
pub const GITHUB_APP_ID_SETTING: &str = "PI_GITHUB_APP_ID";
pub const GITHUB_APP_KEY_SETTING: &str = "PI_GITHUB_APP_KEY_FILE";
/// The token a gitlab job acts with (a secret: read from the worker's environment, never stored).
pub const GITLAB_TOKEN_SETTING: &str = "PI_GITLAB_TOKEN";
/// The user (`UID:GID`) a forge job runs as under a root worker (its clone is that user's).
pub const FORGE_JOB_USER_SETTING: &str = "PI_FORGE_JOB_USER";
/// The queue: the embedded SQLite file (`sqlite`, the default) or a Redis shared by several hosts
/// (`redis://HOST:PORT/DB`, `rediss://` with TLS, `redis+unix:///PATH?db=N`).
pub const QUEUE_SETTING: &str = "PI_QUEUE";
/// The password of the queue's Redis (a secret: read from the worker's environment, never in
/// `PI_QUEUE`'s URL).
pub const QUEUE_PASSWORD_SETTING: &str = "PI_QUEUE_PASSWORD";
/// The sandbox backend: `bubblewrap` (the default), `podman`, or `docker` (the container backend
/// driving Docker instead).
pub const SANDBOX_SETTING: &str = "PI_SANDBOX";
/// A container image whose system every `podman` job sees, with the job's image folder bound over
/// it (without it, a job runs the container image `image build` made of its image), and the OCI
/// runtime it runs with.
pub const PODMAN_IMAGE_SETTING: &str = "PI_PODMAN_IMAGE";
/// Where Debian installs Podman: the engine every part of pi-dispatch runs when no other is found.
pub const PODMAN: &str = "/usr/bin/podman";
pub const PODMAN_RUNTIME_SETTING: &str = "PI_PODMAN_RUNTIME";
/// What a `fix` job's work tree may hold to be published: its largest file, and all its files
/// together, in MiB (a sparse file counts its whole size).
pub const PUBLISH_FILE_MB_SETTING: &str = "PI_JOB_PUBLISH_FILE_MB";
pub const PUBLISH_MB_SETTING: &str = "PI_JOB_PUBLISH_MB";
/// GitHub refuses files over 100 MB; a repository's files together rarely pass 2 GiB.
pub const DEFAULT_PUBLISH_FILE_MB: u64 = 100;
pub const DEFAULT_PUBLISH_MB: u64 = 2048;
pub const MAX_PUBLISH_MB: u64 = 1 << 20;
/// A job's bounds, kept by the kernel (docs/sandbox.md): processes and threads at once, memory
/// with what its `/tmp` holds (MiB), and CPU time of all its processes together (seconds).
pub const JOB_PIDS_SETTING: &str = "PI_JOB_PIDS";
pub const JOB_MEMORY_SETTING: &str = "PI_JOB_MEMORY_MB";
pub const JOB_CPU_SETTING: &str = "PI_JOB_CPU_SECS";
/// What a job may write to its workspace (MiB): the size of the file system its writes go to.
pub const JOB_DISK_SETTING: &str = "PI_JOB_DISK_MB";
pub const DEFAULT_JOB_DISK_MB: u64 = 4096;
pub const DEFAULT_JOB_PIDS: u64 = 1024;
pub const DEFAULT_JOB_MEMORY_MB: u64 = 4096;
pub const DEFAULT_JOB_CPU_SECS: u64 = 7200;
/// The free space the state folder's file system keeps, in MiB: below the first doctor warns; below
/// the second doctor fails and the worker starts no job (its jobs wait in the queue).
pub const DISK_WARN_SETTING: &str = "PI_DISK_WARN_MB";
pub const DISK_MIN_SETTING: &str = "PI_DISK_MIN_MB";
pub const DEFAULT_DISK_WARN_MB: u64 = 4096;
pub const DEFAULT_DISK_MIN_MB: u64 = 1024;
/// How long what jobs leave is kept, in days: records (`runs`, the panel; the metrics' counters
/// keep what they counted), transcripts, and the folder of a job that did not complete (its clone
/// and what it wrote, for a look; 0: removed once the job is settled, as a completed job's is).
pub const KEEP_RECORDS_SETTING: &str = "PI_KEEP_RECORDS_DAYS";
pub const KEEP_TRANSCRIPTS_SETTING: &str = "PI_KEEP_TRANSCRIPTS_DAYS";
pub const KEEP_FAILED_JOBS_SETTING: &str = "PI_KEEP_FAILED_JOBS_DAYS";
pub const DEFAULT_KEEP_RECORDS_DAYS: u64 = 365;
pub const DEFAULT_KEEP_TRANSCRIPTS_DAYS: u64 = 30;
pub const DEFAULT_KEEP_FAILED_JOBS_DAYS: u64 = 0;
/// The longest any of them is kept: a hundred years, which is to say for good.
pub const MAX_KEEP_DAYS: u64 = 36_500;
/// The host ids (uid and gid alike) a root worker's jobs run as, one for each running job, as
/// `FIRST-LAST`: no user, group or other process of the host may use them (docs/sandbox.md).
pub const JOB_UIDS_SETTING: &str = "PI_JOB_UIDS";
/// A range no distribution hands out: above systemd's container ranges, below 2^31.
pub const DEFAULT_JOB_UIDS: (u32, u32) = (1_879_048_192, 1_879_048_447);
/// How long `pi-dispatch run`'s check of a folder for uncommitted changes may take, in seconds.
pub const RUN_CHECK_SETTING: &str = "PI_RUN_CHECK_TIME_LIMIT";
pub const DEFAULT_RUN_CHECK_SECS: u64 = 60;
/// Under a root worker, a forge job runs as `nobody` unless the operator names a user.
pub const DEFAULT_FORGE_JOB_USER: (u32, u32) = (65534, 65534);

/// Jobs the worker runs at once when `PI_WORKER_CONCURRENCY` is not set, and the most it allows.
pub const DEFAULT_CONCURRENCY: u32 = 1;
pub const MAX_CONCURRENCY: u32 = 64;
/// A job's time limit in seconds when `PI_JOB_TIME_LIMIT` is not set, and the bounds it allows.
pub const DEFAULT_TIME_LIMIT_SECS: u64 = 3600;
pub const MAX_TIME_LIMIT_SECS: u64 = 24 * 3600;
/// How long a worker told to stop lets its running jobs finish, in seconds, by default and at most.
pub const DEFAULT_DRAIN_LIMIT_SECS: u64 = 120;
pub const MAX_DRAIN_LIMIT_SECS: u64 = 3600;

pub const TRIGGERS_FILE: &str = "triggers.json";
pub const ALLOWLIST_FILE: &str = "egress-allowlist.conf";
pub const ENDPOINTS_FILE: &str = "model-endpoints.json";

/// Every setting this version reads, for `init`'s `.env` and for doctor.
pub const ALL: [&str; 45] = [
    OVERLAY_SETTING,
    TRIGGERS_SETTING,
    EGRESS_SETTING,
    FORWARD_ENV_SETTING,
    ALLOWLIST_SETTING,
    ENDPOINTS_SETTING,
    REGISTRIES_SETTING,
    JOB_IMAGE_SETTING,
    GITLAB_URL_SETTING,
    PROVIDER_SETTING,
    MODEL_SETTING,
    ON_FAILURE_SETTING,
    CONCURRENCY_SETTING,
    TIME_LIMIT_SETTING,
    DRAIN_LIMIT_SETTING,
    WORKER_LABELS_SETTING,
    HOST_NAME_SETTING,
    HEARTBEAT_SETTING,
    TRANSCRIPTS_SETTING,
    NAMESERVER_SETTING,
    PROXY_DIR_SETTING,
    GITHUB_API_URL_SETTING,
    GITHUB_URL_SETTING,
    GITHUB_APP_ID_SETTING,
    GITHUB_APP_KEY_SETTING,
    GITLAB_TOKEN_SETTING,
    FORGE_JOB_USER_SETTING,
    QUEUE_SETTING,
    QUEUE_PASSWORD_SETTING,
    SANDBOX_SETTING,
    PODMAN_IMAGE_SETTING,
    PODMAN_RUNTIME_SETTING,
    PUBLISH_FILE_MB_SETTING,
    PUBLISH_MB_SETTING,
    RUN_CHECK_SETTING,
    JOB_PIDS_SETTING,
    JOB_MEMORY_SETTING,
    JOB_CPU_SETTING,
    JOB_DISK_SETTING,
    JOB_UIDS_SETTING,
    DISK_WARN_SETTING,
    DISK_MIN_SETTING,
    KEEP_RECORDS_SETTING,
    KEEP_TRANSCRIPTS_SETTING,
    KEEP_FAILED_JOBS_SETTING,
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("{name} must be an absolute path")]
    NotAbsolute { name: &'static str },
    #[error("{name} must be empty or 1 (on) or 0 (off)")]
    NotAFlag { name: &'static str },
    #[error(
        "{name} must be a comma-separated list of variable names (letters, digits and '_', each once)"
    )]
    NotANameList { name: &'static str },
    #[error(
        "{name} must be a comma-separated list of RUNNER=HOST (a package runner such as npx or uvx, each once, and the lowercase host name of the registry it fetches from)"
    )]
    NotARegistryList { name: &'static str },
    #[error(
        "{name} must be an image name (lowercase letters and digits, words joined by '.', '_' or '-')"
    )]
    NotAnImageName { name: &'static str },
    #[error(
        "{name} must be a comma-separated list of labels (lowercase letters, digits, '.', '_' and '-', or key:value of such words; host: is the worker's own), each once"
    )]
    NotALabelList { name: &'static str },
    #[error("{name} must be a host name of lowercase letters, digits, '.', '_' and '-'")]
    NotAHostName { name: &'static str },
    #[error("{name} must be a whole number from {min} to {max}")]
    NotANumber {
        name: &'static str,
        min: u64,
        max: u64,
    },
    #[error("{name} must be a name of letters, digits and '-', '_', '.', '/', ':' (no spaces)")]
    NotAModelName { name: &'static str },
    #[error("{name} must be an IP address and port, as in 192.0.2.53:53 or [2001:db8::53]:53")]
    NotASocketAddress { name: &'static str },
    #[error("{name} must be a plain http(s) URL without user, password, query or fragment")]
    NotAUrl { name: &'static str },
    #[error("{name} must be UID:GID, two numbers above 0")]
    NotAUser { name: &'static str },
    #[error(
        "{name} must be FIRST-LAST, two ids from 1000 to 4294967294 with FIRST no larger than LAST, 65534 not among them"
    )]
    NotAnIdRange { name: &'static str },
    #[error(
        "{name} must be sqlite, or a redis://HOST:PORT/DB, rediss://HOST:PORT/DB or redis+unix:///PATH URL with no password in it (the password goes in PI_QUEUE_PASSWORD)"
    )]
    NotAQueue { name: &'static str },
    #[error("{name} must be bubblewrap, podman or docker")]
    NotASandbox { name: &'static str },
    #[error(
        "{name} must be a container image reference or a runtime name (letters, digits and '.', '_', '-', '/', ':', '@')"
    )]
    NotAnEngineName { name: &'static str },
    #[error("{name} must not be above {limit}: a transcript is found through its record")]
    LongerThan {
        name: &'static str,
        limit: &'static str,
    },
}

impl SettingError {
    /// The setting the error is about.
    pub fn setting(&self) -> &'static str {
        match self {
            SettingError::NotAbsolute { name }
            | SettingError::NotAFlag { name }
            | SettingError::NotANameList { name }
            | SettingError::NotARegistryList { name }
            | SettingError::NotAnImageName { name }
            | SettingError::NotALabelList { name }
            | SettingError::NotAHostName { name }
            | SettingError::NotANumber { name, .. }
            | SettingError::NotAModelName { name }
            | SettingError::NotASocketAddress { name }
            | SettingError::NotAUrl { name }
            | SettingError::NotAUser { name }
            | SettingError::NotAnIdRange { name }
            | SettingError::NotAQueue { name }
            | SettingError::NotASandbox { name }
            | SettingError::NotAnEngineName { name }
            | SettingError::LongerThan { name, .. } => name,
        }
    }
}

/// The deployment's settings, resolved and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The deployment folder: where `.env` is, and what relative paths are relative to.
    pub dir: PathBuf,
    /// `PI_GLOBAL_PI_DIR`, else `DIR/pi-global`.
    pub overlay_dir: PathBuf,
    /// `PI_TRIGGERS_FILE`, else `DIR/triggers.json`.
    pub triggers_file: PathBuf,
    /// `PI_EGRESS`: on unless `0`.
    pub egress: bool,
    /// `PI_FORWARD_ENV`: host variables forwarded into jobs, by name.
    pub forward_env: Vec<String>,
    /// `PI_EGRESS_ALLOWLIST`, else `DIR/egress-allowlist.conf`.
    pub egress_allowlist: PathBuf,
    /// `PI_MODEL_ENDPOINTS`, else `DIR/model-endpoints.json`.
    pub model_endpoints: PathBuf,
    /// `PI_PACKAGE_REGISTRIES`: the registry host each package runner fetches from, as the operator
    /// declares it (no host is built in).
    pub package_registries: Vec<(String, crate::url::Host)>,
    /// `PI_JOB_IMAGE`: the image of jobs whose trigger names none.
    pub job_image: Option<String>,
    /// `GITLAB_URL`, as written; the pickup judges it when a gitlab job names `forge`.
    pub gitlab_url: Option<String>,
    /// `PI_PROVIDER` and `PI_MODEL`: the model of jobs whose trigger names none.
    pub provider: Option<String>,
    pub model: Option<String>,
    /// `PI_ON_FAILURE`: a program run for paid stops (`PROGRAM JOB_ID OUTCOME REASON HOST`), as an
    /// absolute path or relative to the deployment folder.
    pub on_failure: Option<PathBuf>,
    /// `PI_WORKER_CONCURRENCY`: jobs the worker runs at once.
    pub concurrency: u32,
    /// `PI_JOB_TIME_LIMIT`: seconds a job may run before its sandbox is killed.
    pub time_limit_secs: u64,
    /// `PI_WORKER_DRAIN_LIMIT`: seconds a worker told to stop lets its running jobs finish before
    /// it stops them and hands them back to the queue.
    pub drain_limit_secs: u64,
    /// `PI_WORKER_LABELS`, each once, in the order given.
    pub worker_labels: Vec<String>,
    /// `PI_HOST_NAME`; see [`Settings::host_name`].
    pub host_name_setting: Option<String>,
    /// `PI_WORKER_HEARTBEAT_SECS`.
    pub heartbeat_secs: u64,
    /// `PI_TRANSCRIPTS`: keep each job's transcript (on unless `0`).
    pub transcripts: bool,
    /// `PI_EGRESS_NAMESERVER`: the one nameserver the egress proxy asks (`ip:port`), else the
    /// system's resolver.
    pub egress_nameserver: Option<std::net::SocketAddr>,
    /// `PI_EGRESS_PROXY_DIR` (absolute), else `DIR/state/egress`: the folder of the egress proxy's
    /// control socket, which workers sharing one proxy name alike.
    pub egress_proxy_dir: PathBuf,
    /// `PI_GITHUB_API_URL` and `PI_GITHUB_URL`, without a trailing `/`.
    pub github_api_url: String,
    pub github_url: String,
    pub github_app_id: Option<u64>,
    /// `PI_GITHUB_APP_KEY_FILE`, from the deployment folder when relative.
    pub github_app_key_file: Option<PathBuf>,
    /// `PI_FORGE_JOB_USER`.
    pub forge_job_user: Option<(u32, u32)>,
    /// `PI_QUEUE`.
    pub queue: QueueBackend,
    /// `PI_SANDBOX`, with `PI_PODMAN_IMAGE` and `PI_PODMAN_RUNTIME`.
    pub sandbox: SandboxBackend,
    /// `PI_JOB_PUBLISH_FILE_MB` and `PI_JOB_PUBLISH_MB`, in bytes.
    pub publish_file_bytes: u64,
    pub publish_bytes: u64,
    /// `PI_RUN_CHECK_TIME_LIMIT`.
    pub run_check_secs: u64,
    /// `PI_JOB_PIDS`, `PI_JOB_MEMORY_MB` (in bytes here) and `PI_JOB_CPU_SECS`.
    pub job_pids: u64,
    pub job_memory_bytes: u64,
    pub job_cpu_secs: u64,
    /// `PI_JOB_DISK_MB`, in bytes.
    pub job_disk_bytes: u64,
    /// `PI_JOB_UIDS`, first and last.
    pub job_uids: (u32, u32),
    /// `PI_DISK_WARN_MB` and `PI_DISK_MIN_MB`, in bytes: the free space of the state folder's
    /// file system below which doctor warns, and below which no job starts.
    pub disk_warn_bytes: u64,
    pub disk_min_bytes: u64,
    /// `PI_KEEP_RECORDS_DAYS`, `PI_KEEP_TRANSCRIPTS_DAYS` and `PI_KEEP_FAILED_JOBS_DAYS`.
    pub keep: Keep,
}

/// How long what jobs leave is kept, in days.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keep {
    pub records_days: u64,
    /// Never longer than the records: a transcript is found through its record.
    pub transcripts_days: u64,
    /// 0: a job's folder is removed once the job is settled, whatever its outcome.
    pub failed_jobs_days: u64,
}

impl Default for Keep {
    fn default() -> Keep {
        Keep {
            records_days: DEFAULT_KEEP_RECORDS_DAYS,
            transcripts_days: DEFAULT_KEEP_TRANSCRIPTS_DAYS,
            failed_jobs_days: DEFAULT_KEEP_FAILED_JOBS_DAYS,
        }
    }
}

/// Where jobs run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SandboxBackend {
    /// bubblewrap, with the host's system.
    #[default]
    Bubblewrap,
    /// A Podman container: of the job's image as `image build` made it, or of `base` (its
    /// system) with the job's image folder bound over it; with the OCI runtime `runtime` (the
    /// engine's default when none).
    Podman {
        base: Option<String>,
        runtime: Option<String>,
        /// Docker drives the containers instead of Podman (`PI_SANDBOX=docker`).
        docker: bool,
    },
}

impl SandboxBackend {
    /// The container engine's program, for a container backend: the first of `/usr/bin`,
    /// `/usr/local/bin`, `/bin` and `/snap/bin` that holds it (the system's folders only, never
    /// the caller's `PATH`, as a root worker runs it); the first when none does, for the error
    /// that follows.
    pub fn engine(&self) -> Option<&'static str> {
        self.engine_where(&|p| std::path::Path::new(p).is_file())
    }

    /// The container engine to run: [`SandboxBackend::engine`], else Debian's Podman ([`PODMAN`]),
    /// which images are built with and inspected by whatever the backend.
    pub fn engine_or_podman(&self) -> &'static str {
        self.engine().unwrap_or(PODMAN)
    }

    /// [`SandboxBackend::engine`], with `exists` saying which programs are there.
    fn engine_where(&self, exists: &dyn Fn(&str) -> bool) -> Option<&'static str> {
        let candidates: [&'static str; 4] = match self {
            SandboxBackend::Bubblewrap => return None,
            SandboxBackend::Podman { docker: true, .. } => [
                "/usr/bin/docker",
                "/usr/local/bin/docker",
                "/bin/docker",
                "/snap/bin/docker",
            ],
            SandboxBackend::Podman { docker: false, .. } => [
                PODMAN,
                "/usr/local/bin/podman",
                "/bin/podman",
                "/snap/bin/podman",
            ],
        };
        Some(
            candidates
                .into_iter()
                .find(|p| exists(p))
                .unwrap_or(candidates[0]),
        )
    }
}

#[cfg(test)]
mod engine_tests {
    use super::*;

    #[test]
    fn the_engine_is_found_in_the_systems_folders() {
        let docker = SandboxBackend::Podman {
            base: None,
            runtime: None,
            docker: true,
        };
        assert_eq!(
            docker.engine_where(&|p| p == "/usr/local/bin/docker"),
            Some("/usr/local/bin/docker")
        );
        assert_eq!(
            docker.engine_where(&|p| p == "/snap/bin/docker" || p == "/usr/bin/docker"),
            Some("/usr/bin/docker")
        );
        assert_eq!(docker.engine_where(&|_| false), Some("/usr/bin/docker"));
        assert_eq!(SandboxBackend::Bubblewrap.engine_where(&|_| true), None);
    }
}

/// A container image reference or a runtime name: plain characters only, so it can never be read
/// as an option. Pure.
pub fn is_engine_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 255
        && !text.starts_with('-')
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:@".contains(&b))
}

/// Where the queue is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum QueueBackend {
    /// `state/queue.sqlite3` in the deployment folder.
    #[default]
    Sqlite,
    /// A Redis (or Valkey) server, by its URL (which holds no password).
    Redis { url: String },
}

/// `PI_QUEUE`'s value: `sqlite`, or a Redis URL whose user part (if any) holds no password, with
/// no space or control character. Pure.
pub fn parse_queue(value: &str) -> Option<QueueBackend> {
    if value == "sqlite" {
        return Some(QueueBackend::Sqlite);
    }
    if value
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        || value.contains('#')
    {
        return None;
    }
    let rest = value
        .strip_prefix("redis://")
        .or_else(|| value.strip_prefix("rediss://"));
    match rest {
        Some(rest) => {
            let authority = rest.split('/').next().unwrap_or_default();
            let host = match authority.rsplit_once('@') {
                // A user name alone; a password is never written here.
                Some((user, host)) if !user.contains(':') && !user.is_empty() => host,
                Some(_) => return None,
                None => authority,
            };
            (!host.is_empty() && !rest.contains('?')).then(|| QueueBackend::Redis {
                url: value.to_owned(),
            })
        }
        None => {
            let path = value.strip_prefix("redis+unix://")?;
            let (file, query) = path.split_once('?').unwrap_or((path, ""));
            let query_ok = query.is_empty()
                || query
                    .strip_prefix("db=")
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
            (file.starts_with('/') && query_ok).then(|| QueueBackend::Redis {
                url: value.to_owned(),
            })
        }
    }
}

/// The value of a setting: a non-empty value in the process environment wins, then the `.env`.
/// An empty value counts as unset.
pub fn lookup(name: &str, env: Option<String>, dotenv: &Dotenv) -> Option<String> {
    env.filter(|v| !v.is_empty())
        .or_else(|| dotenv.get(name).filter(|v| !v.is_empty()).cloned())
}

/// The overlay folder from the value of `PI_GLOBAL_PI_DIR` (which must be absolute), else
/// `./pi-global` under `dir`.
pub fn overlay_dir(value: Option<String>, dir: &Path) -> Result<PathBuf, SettingError> {
    match value {
        Some(v) => {
            let path = PathBuf::from(v);
            if path.is_absolute() {
                Ok(path)
            } else {
                Err(SettingError::NotAbsolute {
                    name: OVERLAY_SETTING,
                })
            }
        }
        None => Ok(dir.join(DEFAULT_OVERLAY_DIR)),
    }
}

/// Resolves every setting from `get` (the environment over the `.env`, already merged), returning
/// every error at once, in the order the settings are read.
pub fn resolve(
    get: &dyn Fn(&str) -> Option<String>,
    dir: &Path,
) -> Result<Settings, Vec<SettingError>> {
    let mut read = Reader {
        get,
        dir,
        errors: Vec::new(),
    };
    let files = read.files();
    let jobs = read.job_defaults();
    let limits = read.limits();
    let keep = read.keep();
    let worker = read.worker();
    let forge = read.forge();
    let job_uids = read.job_uids();
    let queue = read.queue();
    let sandbox = read.sandbox();
    read.keep_transcripts_within_records(&keep);
    if !read.errors.is_empty() {
        return Err(read.errors);
    }
    Ok(Settings {
        dir: dir.to_owned(),
        overlay_dir: files.overlay_dir,
        triggers_file: files.triggers_file,
        egress: jobs.egress,
        forward_env: jobs.forward_env,
        egress_allowlist: files.egress_allowlist,
        model_endpoints: files.model_endpoints,
        package_registries: jobs.package_registries,
        job_image: jobs.job_image,
        gitlab_url: jobs.gitlab_url,
        provider: jobs.provider,
        model: jobs.model,
        on_failure: jobs.on_failure,
        concurrency: u32::try_from(limits.concurrency).unwrap_or(DEFAULT_CONCURRENCY),
        time_limit_secs: limits.time_limit_secs,
        drain_limit_secs: worker.drain_limit_secs,
        worker_labels: worker.labels,
        host_name_setting: worker.host_name_setting,
        heartbeat_secs: worker.heartbeat_secs,
        transcripts: worker.transcripts,
        egress_nameserver: worker.egress_nameserver,
        egress_proxy_dir: worker.egress_proxy_dir,
        github_api_url: forge.github_api_url,
        github_url: forge.github_url,
        github_app_id: forge.github_app_id,
        github_app_key_file: forge.github_app_key_file,
        forge_job_user: forge.forge_job_user,
        queue,
        sandbox,
        publish_file_bytes: limits.publish_file_mb << 20,
        publish_bytes: limits.publish_mb << 20,
        run_check_secs: limits.run_check_secs,
        job_pids: limits.job_pids,
        job_memory_bytes: limits.job_memory_mb << 20,
        job_cpu_secs: limits.job_cpu_secs,
        job_disk_bytes: limits.job_disk_mb << 20,
        job_uids,
        disk_warn_bytes: limits.disk_warn_mb << 20,
        disk_min_bytes: limits.disk_min_mb << 20,
        keep,
    })
}

/// The deployment's files: the overlay folder, and the files read from the deployment folder.
struct DeploymentFiles {
    overlay_dir: PathBuf,
    triggers_file: PathBuf,
    egress_allowlist: PathBuf,
    model_endpoints: PathBuf,
}

/// What a job runs with unless its trigger says otherwise.
struct JobDefaults {
    egress: bool,
    forward_env: Vec<String>,
    package_registries: Vec<(String, crate::url::Host)>,
    job_image: Option<String>,
    gitlab_url: Option<String>,
    provider: Option<String>,
    model: Option<String>,
    on_failure: Option<PathBuf>,
}

/// The worker's numbers and a job's bounds, as written (sizes in MiB).
struct Limits {
    concurrency: u64,
    time_limit_secs: u64,
    publish_file_mb: u64,
    publish_mb: u64,
    run_check_secs: u64,
    job_pids: u64,
    job_memory_mb: u64,
    job_cpu_secs: u64,
    job_disk_mb: u64,
    disk_warn_mb: u64,
    disk_min_mb: u64,
}

/// How the worker runs on this host: its stop and heartbeat, its labels and name, transcripts, and
/// the egress proxy's nameserver and folder.
struct WorkerSetup {
    drain_limit_secs: u64,
    heartbeat_secs: u64,
    labels: Vec<String>,
    host_name_setting: Option<String>,
    transcripts: bool,
    egress_nameserver: Option<std::net::SocketAddr>,
    egress_proxy_dir: PathBuf,
}

/// Where forge jobs clone from and act on, and who they run as.
struct ForgeAccess {
    github_api_url: String,
    github_url: String,
    github_app_id: Option<u64>,
    github_app_key_file: Option<PathBuf>,
    forge_job_user: Option<(u32, u32)>,
}

/// Reads settings one at a time: a bad one keeps its error (in the order read) and a stand-in
/// value, so that every error is found at once.
struct Reader<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
    dir: &'a Path,
    errors: Vec<SettingError>,
}

/// The error a setting's bad value makes, from the setting's name.
type ErrorFor = fn(&'static str) -> SettingError;

impl Reader<'_> {
    fn value(&self, name: &str) -> Option<String> {
        (self.get)(name)
    }

    /// The setting parsed by `parse`, `default` when unset; when `parse` refuses it, its error is
    /// kept and `default` stands in.
    fn parsed<T>(
        &mut self,
        name: &'static str,
        parse: impl FnOnce(&str) -> Option<T>,
        error: impl FnOnce(&'static str) -> SettingError,
        default: T,
    ) -> T {
        match self.value(name) {
            None => default,
            Some(v) => parse(&v).unwrap_or_else(|| {
                self.errors.push(error(name));
                default
            }),
        }
    }

    /// An optional setting parsed by `parse`; when it refuses the value, its error is kept.
    fn optional<T>(
        &mut self,
        name: &'static str,
        parse: impl FnOnce(&str) -> Option<T>,
        error: ErrorFor,
    ) -> Option<T> {
        self.parsed(name, |v| parse(v).map(Some), error, None)
    }

    /// An optional setting, kept as written when `is_ok` holds for it.
    fn checked(
        &mut self,
        name: &'static str,
        is_ok: fn(&str) -> bool,
        error: ErrorFor,
    ) -> Option<String> {
        self.optional(name, |v| is_ok(v).then(|| v.to_owned()), error)
    }

    /// A flag: `1` (on) or `0` (off), on when unset.
    fn flag(&mut self, name: &'static str) -> bool {
        let flag = |v: &str| match v {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        };
        self.parsed(name, flag, |name| SettingError::NotAFlag { name }, true)
    }

    /// A whole number from `min` to `max` (no sign), `default` when unset.
    fn number(&mut self, name: &'static str, default: u64, min: u64, max: u64) -> u64 {
        let number = |v: &str| {
            v.parse::<u64>()
                .ok()
                .filter(|n| (min..=max).contains(n) && !v.starts_with('+'))
        };
        let error = |name| SettingError::NotANumber { name, min, max };
        self.parsed(name, number, error, default)
    }

    /// A path from the deployment folder (an absolute one as it is).
    fn path_in_dir(&self, name: &str) -> Option<PathBuf> {
        self.value(name).map(|v| self.dir.join(v))
    }

    /// A file in the deployment folder, `default` when the setting is unset.
    fn file(&self, name: &str, default: &str) -> PathBuf {
        self.path_in_dir(name)
            .unwrap_or_else(|| self.dir.join(default))
    }

    /// A plain http(s) URL, `default` when unset, without a trailing `/`.
    fn plain_url(&mut self, name: &'static str, default: &str) -> String {
        let value = self.value(name).unwrap_or_else(|| default.to_owned());
        if !is_plain_http_url(&value) {
            self.errors.push(SettingError::NotAUrl { name });
        }
        value.trim_end_matches('/').to_owned()
    }

    fn files(&mut self) -> DeploymentFiles {
        let overlay_dir = overlay_dir(self.value(OVERLAY_SETTING), self.dir).unwrap_or_else(|e| {
            self.errors.push(e);
            PathBuf::new()
        });
        DeploymentFiles {
            overlay_dir,
            triggers_file: self.file(TRIGGERS_SETTING, TRIGGERS_FILE),
            egress_allowlist: self.file(ALLOWLIST_SETTING, ALLOWLIST_FILE),
            model_endpoints: self.file(ENDPOINTS_SETTING, ENDPOINTS_FILE),
        }
    }

    fn job_defaults(&mut self) -> JobDefaults {
        use SettingError::{NotAModelName, NotANameList, NotARegistryList, NotAnImageName};
        let name_list = |name| NotANameList { name };
        let registry_list = |name| NotARegistryList { name };
        JobDefaults {
            egress: self.flag(EGRESS_SETTING),
            forward_env: self.parsed(FORWARD_ENV_SETTING, parse_name_list, name_list, Vec::new()),
            package_registries: self.parsed(
                REGISTRIES_SETTING,
                parse_registries,
                registry_list,
                Vec::new(),
            ),
            job_image: self.checked(JOB_IMAGE_SETTING, is_image_name, |name| NotAnImageName {
                name,
            }),
            gitlab_url: self.value(GITLAB_URL_SETTING),
            provider: self.checked(PROVIDER_SETTING, is_model_name, |name| NotAModelName {
                name,
            }),
            model: self.checked(MODEL_SETTING, is_model_name, |name| NotAModelName { name }),
            on_failure: self.path_in_dir(ON_FAILURE_SETTING),
        }
    }

    fn limits(&mut self) -> Limits {
        Limits {
            concurrency: self.number(
                CONCURRENCY_SETTING,
                u64::from(DEFAULT_CONCURRENCY),
                1,
                u64::from(MAX_CONCURRENCY),
            ),
            time_limit_secs: self.number(
                TIME_LIMIT_SETTING,
                DEFAULT_TIME_LIMIT_SECS,
                1,
                MAX_TIME_LIMIT_SECS,
            ),
            publish_file_mb: self.number(
                PUBLISH_FILE_MB_SETTING,
                DEFAULT_PUBLISH_FILE_MB,
                1,
                MAX_PUBLISH_MB,
            ),
            publish_mb: self.number(PUBLISH_MB_SETTING, DEFAULT_PUBLISH_MB, 1, MAX_PUBLISH_MB),
            run_check_secs: self.number(RUN_CHECK_SETTING, DEFAULT_RUN_CHECK_SECS, 1, 3600),
            job_pids: self.number(JOB_PIDS_SETTING, DEFAULT_JOB_PIDS, 16, 4_194_304),
            job_memory_mb: self.number(JOB_MEMORY_SETTING, DEFAULT_JOB_MEMORY_MB, 64, 1 << 24),
            job_cpu_secs: self.number(JOB_CPU_SETTING, DEFAULT_JOB_CPU_SECS, 1, 30 * 24 * 3600),
            job_disk_mb: self.number(JOB_DISK_SETTING, DEFAULT_JOB_DISK_MB, 16, 1 << 24),
            disk_warn_mb: self.number(DISK_WARN_SETTING, DEFAULT_DISK_WARN_MB, 0, 1 << 30),
            disk_min_mb: self.number(DISK_MIN_SETTING, DEFAULT_DISK_MIN_MB, 0, 1 << 30),
        }
    }

    fn keep(&mut self) -> Keep {
        Keep {
            records_days: self.number(
                KEEP_RECORDS_SETTING,
                DEFAULT_KEEP_RECORDS_DAYS,
                1,
                MAX_KEEP_DAYS,
            ),
            transcripts_days: self.number(
                KEEP_TRANSCRIPTS_SETTING,
                DEFAULT_KEEP_TRANSCRIPTS_DAYS,
                1,
                MAX_KEEP_DAYS,
            ),
            failed_jobs_days: self.number(
                KEEP_FAILED_JOBS_SETTING,
                DEFAULT_KEEP_FAILED_JOBS_DAYS,
                0,
                MAX_KEEP_DAYS,
            ),
        }
    }

    /// A transcript is found through its record, so it is never kept longer.
    fn keep_transcripts_within_records(&mut self, keep: &Keep) {
        if keep.transcripts_days > keep.records_days {
            self.errors.push(SettingError::LongerThan {
                name: KEEP_TRANSCRIPTS_SETTING,
                limit: KEEP_RECORDS_SETTING,
            });
        }
    }

    fn worker(&mut self) -> WorkerSetup {
        use SettingError::{NotAHostName, NotALabelList, NotASocketAddress, NotAbsolute};
        let drain_limit_secs = self.number(
            DRAIN_LIMIT_SETTING,
            DEFAULT_DRAIN_LIMIT_SECS,
            0,
            MAX_DRAIN_LIMIT_SECS,
        );
        let heartbeat_secs = self.number(
            HEARTBEAT_SETTING,
            DEFAULT_HEARTBEAT_SECS,
            1,
            MAX_HEARTBEAT_SECS,
        );
        let label_list = |name| NotALabelList { name };
        let absolute = |v: &str| Path::new(v).is_absolute().then(|| PathBuf::from(v));
        let default_proxy_dir = self.dir.join("state").join("egress");
        WorkerSetup {
            drain_limit_secs,
            heartbeat_secs,
            labels: self.parsed(WORKER_LABELS_SETTING, parse_labels, label_list, Vec::new()),
            host_name_setting: self.checked(HOST_NAME_SETTING, is_host_part, |name| NotAHostName {
                name,
            }),
            transcripts: self.flag(TRANSCRIPTS_SETTING),
            egress_nameserver: self.optional(
                NAMESERVER_SETTING,
                |v| v.parse().ok(),
                |name| NotASocketAddress { name },
            ),
            egress_proxy_dir: self.parsed(
                PROXY_DIR_SETTING,
                absolute,
                |name| NotAbsolute { name },
                default_proxy_dir,
            ),
        }
    }

    fn forge(&mut self) -> ForgeAccess {
        let app_id = |v: &str| {
            v.parse::<u64>()
                .ok()
                .filter(|n| *n > 0 && !v.starts_with('+'))
        };
        let not_an_app_id = |name| SettingError::NotANumber {
            name,
            min: 1,
            max: u64::MAX,
        };
        let user = |v: &str| {
            v.split_once(':')
                .and_then(|(u, g)| Some((u.parse::<u32>().ok()?, g.parse::<u32>().ok()?)))
                .filter(|(u, g)| *u > 0 && *g > 0)
        };
        ForgeAccess {
            github_api_url: self.plain_url(GITHUB_API_URL_SETTING, DEFAULT_GITHUB_API_URL),
            github_url: self.plain_url(GITHUB_URL_SETTING, DEFAULT_GITHUB_URL),
            github_app_id: self.optional(GITHUB_APP_ID_SETTING, app_id, not_an_app_id),
            github_app_key_file: self.path_in_dir(GITHUB_APP_KEY_SETTING),
            forge_job_user: self.optional(FORGE_JOB_USER_SETTING, user, |name| {
                SettingError::NotAUser { name }
            }),
        }
    }

    fn job_uids(&mut self) -> (u32, u32) {
        let error = |name| SettingError::NotAnIdRange { name };
        self.parsed(JOB_UIDS_SETTING, parse_id_range, error, DEFAULT_JOB_UIDS)
    }

    fn queue(&mut self) -> QueueBackend {
        let error = |name| SettingError::NotAQueue { name };
        self.parsed(QUEUE_SETTING, parse_queue, error, QueueBackend::Sqlite)
    }

    /// `PI_SANDBOX`, with `PI_PODMAN_IMAGE` and `PI_PODMAN_RUNTIME` (checked whatever the backend).
    fn sandbox(&mut self) -> SandboxBackend {
        let engine_name = |name| SettingError::NotAnEngineName { name };
        let base = self.checked(PODMAN_IMAGE_SETTING, is_engine_name, engine_name);
        let runtime = self.checked(PODMAN_RUNTIME_SETTING, is_engine_name, engine_name);
        let backend = |v: &str| match v {
            "bubblewrap" => Some(SandboxBackend::Bubblewrap),
            "podman" | "docker" => Some(SandboxBackend::Podman {
                base,
                runtime,
                docker: v == "docker",
            }),
            _ => None,
        };
        let error = |name| SettingError::NotASandbox { name };
        self.parsed(SANDBOX_SETTING, backend, error, SandboxBackend::Bubblewrap)
    }
}

impl Settings {
    /// This host's name in the queue: `PI_HOST_NAME`, else the system's host name lowercased
    /// (each character a label does not allow made '-').
    pub fn host_name(&self) -> String {
        if let Some(name) = &self.host_name_setting {
            return name.clone();
        }
        let system = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let name: String = system
            .trim()
            .to_ascii_lowercase()
            .chars()
            .map(|c| {
                if c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        if is_host_part(&name) {
            name
        } else {
            "localhost".to_owned()
        }
    }

    /// The labels this host's workers carry: `host:NAME`, then `PI_WORKER_LABELS`.
    pub fn labels(&self) -> Vec<String> {
        let mut labels = vec![protocol::job::host_label(&self.host_name())];
        labels.extend(self.worker_labels.iter().cloned());
        labels
    }

    /// How long a worker may go unseen before it is shown as gone: three heartbeats.
    pub fn worker_gone_after(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.heartbeat_secs.saturating_mul(3))
    }
}

/// A host name as a label's value: a label with no ':'.
fn is_host_part(name: &str) -> bool {
    !name.contains(':') && protocol::job::is_label(name)
}

/// `gpu, zone:eu`: labels separated by commas, each once; `host:` is each worker's own.
fn parse_labels(text: &str) -> Option<Vec<String>> {
    let mut labels: Vec<String> = Vec::new();
    for part in text.split(',') {
        let label = part.trim();
        if !protocol::job::is_label(label)
            || label.starts_with("host:")
            || labels.iter().any(|l| l == label)
        {
            return None;
        }
        labels.push(label.to_owned());
    }
    (labels.len() <= protocol::job::MAX_LABELS).then_some(labels)
}

/// `FIRST-LAST`: ids from 1000 up, in order, not holding 65534 (`nobody`). Pure.
pub fn parse_id_range(text: &str) -> Option<(u32, u32)> {
    let (first, last) = text.split_once('-')?;
    let number = |t: &str| {
        (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .then(|| t.parse::<u32>().ok())
            .flatten()
    };
    let (first, last) = (number(first)?, number(last)?);
    (first >= 1000 && first <= last && last < u32::MAX && !(first..=last).contains(&65534))
        .then_some((first, last))
}

/// A plain `http://` or `https://` URL: a host, maybe a port and a path; no user, password,
/// query, fragment, comma or space.
pub fn is_plain_http_url(text: &str) -> bool {
    let Some(rest) = text
        .strip_prefix("https://")
        .or_else(|| text.strip_prefix("http://"))
    else {
        return false;
    };
    let host = rest.split('/').next().unwrap_or_default();
    !host.is_empty()
        && !text.contains(['@', '?', '#', ',', ' ', '$'])
        && text.chars().all(|c| c.is_ascii_graphic())
}

/// A provider or model name: 1 to 128 of letters, digits and `-_./:@`.
pub fn is_model_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:@".contains(&b))
}

/// `npx=registry.example.org, uvx=pypi.example.org`: each runner once, each host a plain host name.
fn parse_registries(text: &str) -> Option<Vec<(String, crate::url::Host)>> {
    let mut out: Vec<(String, crate::url::Host)> = Vec::new();
    for part in text.split(',') {
        let (runner, host) = part.trim().split_once('=')?;
        if !crate::mcp::PACKAGE_RUNNERS.contains(&runner) || out.iter().any(|(r, _)| r == runner) {
            return None;
        }
        let host = crate::url::parse_host_name(host).ok()?;
        out.push((runner.to_owned(), host));
    }
    Some(out)
}

/// An image name: `^[a-z0-9]+([._-][a-z0-9]+)*$`, at most 64 characters.
pub fn is_image_name(s: &str) -> bool {
    s.len() <= 64
        && s.split(['.', '_', '-']).all(|w| {
            !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// `A,B, C`: names separated by commas, spaces around them allowed, each a variable name, once.
fn parse_name_list(text: &str) -> Option<Vec<String>> {
    let mut names: Vec<String> = Vec::new();
    for part in text.split(',') {
        let name = part.trim();
        if !crate::dotenv::is_variable_name(name) || names.iter().any(|n| n == name) {
            return None;
        }
        names.push(name.to_owned());
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn the_queue_is_sqlite_or_a_redis_url_without_a_password() {
        assert_eq!(parse_queue("sqlite"), Some(QueueBackend::Sqlite));
        for good in [
            "redis://127.0.0.1:6379/0",
            "redis://queue.internal:6380/2",
            "rediss://worker@queue.internal:6380/0",
            "redis+unix:///run/redis/redis.sock",
            "redis+unix:///run/redis/redis.sock?db=3",
        ] {
            assert_eq!(
                parse_queue(good),
                Some(QueueBackend::Redis {
                    url: good.to_owned()
                }),
                "{good}"
            );
        }
        for bad in [
            "",
            "Redis://h:6379/0",
            "redis://user:CNRY-pass@h:6379/0",
            "redis://:CNRY-pass@h:6379/0",
            "redis://h:6379/0?password=CNRY",
            "redis://h:6379/0#x",
            "redis:// h:6379/0",
            "redis+unix://relative.sock",
            "redis+unix:///s.sock?password=CNRY",
            "postgres://h/db",
        ] {
            assert_eq!(parse_queue(bad), None, "{bad}");
        }
        // The error names the setting, never the value.
        let e = resolve(
            &|n: &str| (n == QUEUE_SETTING).then(|| "redis://u:CNRY-pass@h/0".to_owned()),
            Path::new("/srv/d"),
        )
        .unwrap_err();
        assert_eq!(e[0].setting(), QUEUE_SETTING);
        assert!(!e[0].to_string().contains("CNRY"), "{}", e[0]);
    }

    #[test]
    fn environment_wins_over_dotenv_and_empty_counts_as_unset() {
        let dotenv: Dotenv = [("A".to_owned(), "dotenv".to_owned())].into();
        assert_eq!(lookup("A", Some("env".into()), &dotenv), Some("env".into()));
        assert_eq!(
            lookup("A", Some(String::new()), &dotenv),
            Some("dotenv".into())
        );
        assert_eq!(lookup("A", None, &dotenv), Some("dotenv".into()));
        let empty: Dotenv = [("A".to_owned(), String::new())].into();
        assert_eq!(lookup("A", None, &empty), None);
    }

    #[test]
    fn defaults_sit_in_the_deployment_folder() {
        let s = resolve(&from(&[]), Path::new("/srv/d")).unwrap();
        assert_eq!(s.overlay_dir, PathBuf::from("/srv/d/pi-global"));
        assert_eq!(s.triggers_file, PathBuf::from("/srv/d/triggers.json"));
        assert_eq!(
            s.egress_allowlist,
            PathBuf::from("/srv/d/egress-allowlist.conf")
        );
        assert_eq!(
            s.model_endpoints,
            PathBuf::from("/srv/d/model-endpoints.json")
        );
        assert!(s.egress);
        assert!(s.forward_env.is_empty());
    }

    #[test]
    fn settings_override_the_defaults() {
        let s = resolve(
            &from(&[
                ("PI_GLOBAL_PI_DIR", "/srv/overlay"),
                ("PI_TRIGGERS_FILE", "conf/triggers.json"),
                ("PI_EGRESS_ALLOWLIST", "/etc/allow.conf"),
                ("PI_EGRESS", "0"),
                ("PI_FORWARD_ENV", "DOCS_TOKEN, FILES_TOKEN"),
            ]),
            Path::new("/srv/d"),
        )
        .unwrap();
        assert_eq!(s.overlay_dir, PathBuf::from("/srv/overlay"));
        assert_eq!(s.triggers_file, PathBuf::from("/srv/d/conf/triggers.json"));
        assert_eq!(s.egress_allowlist, PathBuf::from("/etc/allow.conf"));
        assert!(!s.egress);
        assert_eq!(s.forward_env, ["DOCS_TOKEN", "FILES_TOKEN"]);
        assert!(
            resolve(&from(&[("PI_EGRESS", "1")]), Path::new("/d"))
                .unwrap()
                .egress
        );
    }

    #[test]
    fn the_workers_settings_and_their_bounds() {
        let s = resolve(&from(&[]), Path::new("/d")).unwrap();
        assert_eq!((s.concurrency, s.time_limit_secs), (1, 3600));
        assert_eq!(
            (s.provider.as_deref(), s.on_failure.as_deref()),
            (None, None)
        );
        let s = resolve(
            &from(&[
                ("PI_WORKER_CONCURRENCY", "4"),
                ("PI_JOB_TIME_LIMIT", "90"),
                ("PI_PROVIDER", "fake"),
                ("PI_MODEL", "fake-model"),
                ("PI_ON_FAILURE", "bin/page"),
            ]),
            Path::new("/d"),
        )
        .unwrap();
        assert_eq!((s.concurrency, s.time_limit_secs), (4, 90));
        assert_eq!(s.model.as_deref(), Some("fake-model"));
        assert_eq!(s.on_failure, Some(PathBuf::from("/d/bin/page")));
        for (name, bad) in [
            ("PI_WORKER_CONCURRENCY", "0"),
            ("PI_WORKER_CONCURRENCY", "65"),
            ("PI_WORKER_CONCURRENCY", "+2"),
            ("PI_JOB_TIME_LIMIT", "1h"),
            ("PI_MODEL", "two words"),
            ("PI_PROVIDER", "a\nb"),
        ] {
            let errors = resolve(&from(&[(name, bad)]), Path::new("/d")).unwrap_err();
            assert_eq!(errors[0].setting(), name, "{bad}");
            assert!(
                !errors[0].to_string().contains(bad),
                "the value is in the message"
            );
        }
    }

    #[test]
    fn what_jobs_leave_is_kept_a_year_transcripts_a_month_and_never_longer_than_records() {
        let d = Path::new("/d");
        assert_eq!(resolve(&from(&[]), d).unwrap().keep, Keep::default());
        let set = resolve(
            &from(&[
                ("PI_KEEP_RECORDS_DAYS", "90"),
                ("PI_KEEP_TRANSCRIPTS_DAYS", "90"),
                ("PI_KEEP_FAILED_JOBS_DAYS", "7"),
            ]),
            d,
        )
        .unwrap();
        let want = Keep {
            records_days: 90,
            transcripts_days: 90,
            failed_jobs_days: 7,
        };
        assert_eq!(set.keep, want);
        let longer = resolve(&from(&[("PI_KEEP_RECORDS_DAYS", "7")]), d).unwrap_err();
        assert_eq!(
            longer,
            [SettingError::LongerThan {
                name: KEEP_TRANSCRIPTS_SETTING,
                limit: KEEP_RECORDS_SETTING
            }]
        );
        for bad in ["0", "-1", "36501", "1.5"] {
            let e = resolve(&from(&[("PI_KEEP_RECORDS_DAYS", bad)]), d).unwrap_err();
            assert!(
                matches!(
                    e[0],
                    SettingError::NotANumber {
                        name: KEEP_RECORDS_SETTING,
                        ..
                    }
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn registries_and_the_job_image() {
        let s = resolve(
            &from(&[
                (
                    "PI_PACKAGE_REGISTRIES",
                    "npx=registry.example.org, uvx=pypi.example.org",
                ),
                ("PI_JOB_IMAGE", "pi-job.v1"),
                ("GITLAB_URL", "https://gitlab.example.com"),
            ]),
            Path::new("/d"),
        )
        .unwrap();
        let runners: Vec<&str> = s
            .package_registries
            .iter()
            .map(|(r, _)| r.as_str())
            .collect();
        assert_eq!(runners, ["npx", "uvx"]);
        assert_eq!(
            s.package_registries[0].1.to_string(),
            "registry.example.org"
        );
        assert_eq!(s.job_image.as_deref(), Some("pi-job.v1"));
        assert_eq!(s.gitlab_url.as_deref(), Some("https://gitlab.example.com"));
        for bad in [
            "npx",
            "npx=",
            "node=h.example",
            "npx=a.example,npx=b.example",
            "npx=H.example",
            "npx=https://h",
        ] {
            let r = resolve(&from(&[("PI_PACKAGE_REGISTRIES", bad)]), Path::new("/d"));
            assert_eq!(
                r.unwrap_err()[0].setting(),
                "PI_PACKAGE_REGISTRIES",
                "{bad}"
            );
        }
        for bad in ["Pi-Job", "a..b", "-a", ""] {
            if bad.is_empty() {
                continue; // empty counts as unset
            }
            let r = resolve(&from(&[("PI_JOB_IMAGE", bad)]), Path::new("/d"));
            assert!(r.is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_values_are_named_all_at_once_never_quoted() {
        let errors = resolve(
            &from(&[
                ("PI_GLOBAL_PI_DIR", "relative/cnry"),
                ("PI_EGRESS", "yes-cnry"),
                ("PI_FORWARD_ENV", "A,,B"),
            ]),
            Path::new("/d"),
        )
        .unwrap_err();
        let names: Vec<&str> = errors.iter().map(SettingError::setting).collect();
        assert_eq!(names, ["PI_GLOBAL_PI_DIR", "PI_EGRESS", "PI_FORWARD_ENV"]);
        for e in &errors {
            assert!(!e.to_string().contains("cnry"), "{e}");
        }
        for bad in ["A B", "1A", "A,A", "A-B", " , "] {
            let r = resolve(&from(&[("PI_FORWARD_ENV", bad)]), Path::new("/d"));
            assert!(r.is_err(), "{bad:?}");
        }
        for bad in ["true", "on", "2", " 1"] {
            let r = resolve(&from(&[("PI_EGRESS", bad)]), Path::new("/d"));
            assert!(r.is_err(), "{bad:?}");
        }
    }

    /// Every setting given a bad value: each is named, in the order the settings are read.
    #[test]
    fn every_bad_setting_is_named_in_the_order_they_are_read() {
        let numbers = [
            CONCURRENCY_SETTING,
            TIME_LIMIT_SETTING,
            PUBLISH_FILE_MB_SETTING,
            PUBLISH_MB_SETTING,
            RUN_CHECK_SETTING,
            JOB_PIDS_SETTING,
            JOB_MEMORY_SETTING,
            JOB_CPU_SETTING,
            JOB_DISK_SETTING,
            DISK_WARN_SETTING,
            DISK_MIN_SETTING,
            KEEP_RECORDS_SETTING,
            KEEP_TRANSCRIPTS_SETTING,
            KEEP_FAILED_JOBS_SETTING,
            DRAIN_LIMIT_SETTING,
            HEARTBEAT_SETTING,
        ];
        let mut pairs: Vec<(&str, &str)> = vec![
            (OVERLAY_SETTING, "relative"),
            (TRIGGERS_SETTING, "t.json"),
            (EGRESS_SETTING, "yes"),
            (FORWARD_ENV_SETTING, "A,A"),
            (ALLOWLIST_SETTING, "a.conf"),
            (ENDPOINTS_SETTING, "e.json"),
            (REGISTRIES_SETTING, "npx"),
            (JOB_IMAGE_SETTING, "Pi"),
            (GITLAB_URL_SETTING, "not checked here"),
            (PROVIDER_SETTING, "two words"),
            (MODEL_SETTING, "two words"),
            (ON_FAILURE_SETTING, "bin/page"),
            (WORKER_LABELS_SETTING, "host:a"),
            (HOST_NAME_SETTING, "a:b"),
            (TRANSCRIPTS_SETTING, "2"),
            (NAMESERVER_SETTING, "192.0.2.53"),
            (PROXY_DIR_SETTING, "relative"),
            (GITHUB_API_URL_SETTING, "ftp://h"),
            (GITHUB_URL_SETTING, "https://u@h"),
            (GITHUB_APP_ID_SETTING, "0"),
            (GITHUB_APP_KEY_SETTING, "key.pem"),
            (FORGE_JOB_USER_SETTING, "0:0"),
            (JOB_UIDS_SETTING, "5-10"),
            (QUEUE_SETTING, "postgres://h/db"),
            (PODMAN_IMAGE_SETTING, "-x"),
            (PODMAN_RUNTIME_SETTING, "-y"),
            (SANDBOX_SETTING, "lxc"),
        ];
        pairs.extend(numbers.iter().map(|n| (*n, "x")));
        let errors = resolve(&from(&pairs), Path::new("/d")).unwrap_err();
        let number = |name: &'static str| {
            let (min, max) = match name {
                CONCURRENCY_SETTING => (1, u64::from(MAX_CONCURRENCY)),
                TIME_LIMIT_SETTING => (1, MAX_TIME_LIMIT_SECS),
                PUBLISH_FILE_MB_SETTING | PUBLISH_MB_SETTING => (1, MAX_PUBLISH_MB),
                RUN_CHECK_SETTING => (1, 3600),
                JOB_PIDS_SETTING => (16, 4_194_304),
                JOB_MEMORY_SETTING => (64, 1 << 24),
                JOB_CPU_SETTING => (1, 30 * 24 * 3600),
                JOB_DISK_SETTING => (16, 1 << 24),
                DISK_WARN_SETTING | DISK_MIN_SETTING => (0, 1 << 30),
                KEEP_RECORDS_SETTING | KEEP_TRANSCRIPTS_SETTING => (1, MAX_KEEP_DAYS),
                KEEP_FAILED_JOBS_SETTING => (0, MAX_KEEP_DAYS),
                DRAIN_LIMIT_SETTING => (0, MAX_DRAIN_LIMIT_SECS),
                _ => (1, MAX_HEARTBEAT_SECS),
            };
            SettingError::NotANumber { name, min, max }
        };
        let mut want = vec![
            SettingError::NotAbsolute {
                name: OVERLAY_SETTING,
            },
            SettingError::NotAFlag {
                name: EGRESS_SETTING,
            },
            SettingError::NotANameList {
                name: FORWARD_ENV_SETTING,
            },
            SettingError::NotARegistryList {
                name: REGISTRIES_SETTING,
            },
            SettingError::NotAnImageName {
                name: JOB_IMAGE_SETTING,
            },
            SettingError::NotAModelName {
                name: PROVIDER_SETTING,
            },
            SettingError::NotAModelName {
                name: MODEL_SETTING,
            },
        ];
        want.extend(numbers.iter().copied().map(number));
        want.extend([
            SettingError::NotALabelList {
                name: WORKER_LABELS_SETTING,
            },
            SettingError::NotAHostName {
                name: HOST_NAME_SETTING,
            },
            SettingError::NotAFlag {
                name: TRANSCRIPTS_SETTING,
            },
            SettingError::NotASocketAddress {
                name: NAMESERVER_SETTING,
            },
            SettingError::NotAbsolute {
                name: PROXY_DIR_SETTING,
            },
            SettingError::NotAUrl {
                name: GITHUB_API_URL_SETTING,
            },
            SettingError::NotAUrl {
                name: GITHUB_URL_SETTING,
            },
            SettingError::NotANumber {
                name: GITHUB_APP_ID_SETTING,
                min: 1,
                max: u64::MAX,
            },
            SettingError::NotAUser {
                name: FORGE_JOB_USER_SETTING,
            },
            SettingError::NotAnIdRange {
                name: JOB_UIDS_SETTING,
            },
            SettingError::NotAQueue {
                name: QUEUE_SETTING,
            },
            SettingError::NotAnEngineName {
                name: PODMAN_IMAGE_SETTING,
            },
            SettingError::NotAnEngineName {
                name: PODMAN_RUNTIME_SETTING,
            },
            SettingError::NotASandbox {
                name: SANDBOX_SETTING,
            },
        ]);
        assert_eq!(errors, want);
    }

    /// Every setting given a good value: each lands in its field, sizes in bytes, URLs without a
    /// trailing '/'.
    #[test]
    fn every_good_setting_lands_in_its_field() {
        let s = resolve(
            &from(&[
                (OVERLAY_SETTING, "/srv/overlay"),
                (TRIGGERS_SETTING, "t.json"),
                (EGRESS_SETTING, "0"),
                (FORWARD_ENV_SETTING, "A, B"),
                (ALLOWLIST_SETTING, "a.conf"),
                (ENDPOINTS_SETTING, "/etc/e.json"),
                (REGISTRIES_SETTING, "npx=registry.example.org"),
                (JOB_IMAGE_SETTING, "pi-job.v2"),
                (GITLAB_URL_SETTING, "https://gitlab.example.com"),
                (PROVIDER_SETTING, "fake"),
                (MODEL_SETTING, "fake-model"),
                (ON_FAILURE_SETTING, "bin/page"),
                (CONCURRENCY_SETTING, "3"),
                (TIME_LIMIT_SETTING, "600"),
                (DRAIN_LIMIT_SETTING, "0"),
                (WORKER_LABELS_SETTING, "gpu, zone:eu"),
                (HOST_NAME_SETTING, "builder-1"),
                (HEARTBEAT_SETTING, "5"),
                (TRANSCRIPTS_SETTING, "0"),
                (NAMESERVER_SETTING, "[2001:db8::53]:53"),
                (PROXY_DIR_SETTING, "/run/egress"),
                (GITHUB_API_URL_SETTING, "https://ghe.example.com/api/v3/"),
                (GITHUB_URL_SETTING, "https://ghe.example.com"),
                (GITHUB_APP_ID_SETTING, "42"),
                (GITHUB_APP_KEY_SETTING, "key.pem"),
                (FORGE_JOB_USER_SETTING, "1000:1001"),
                (QUEUE_SETTING, "redis://127.0.0.1:6379/0"),
                (SANDBOX_SETTING, "docker"),
                (PODMAN_IMAGE_SETTING, "debian:13"),
                (PODMAN_RUNTIME_SETTING, "crun"),
                (PUBLISH_FILE_MB_SETTING, "10"),
                (PUBLISH_MB_SETTING, "20"),
                (RUN_CHECK_SETTING, "30"),
                (JOB_PIDS_SETTING, "100"),
                (JOB_MEMORY_SETTING, "128"),
                (JOB_CPU_SETTING, "60"),
                (JOB_DISK_SETTING, "32"),
                (JOB_UIDS_SETTING, "200000-200009"),
                (DISK_WARN_SETTING, "2"),
                (DISK_MIN_SETTING, "1"),
                (KEEP_RECORDS_SETTING, "30"),
                (KEEP_TRANSCRIPTS_SETTING, "7"),
                (KEEP_FAILED_JOBS_SETTING, "3"),
            ]),
            Path::new("/d"),
        )
        .unwrap();
        let want = Settings {
            dir: PathBuf::from("/d"),
            overlay_dir: PathBuf::from("/srv/overlay"),
            triggers_file: PathBuf::from("/d/t.json"),
            egress: false,
            forward_env: vec!["A".to_owned(), "B".to_owned()],
            egress_allowlist: PathBuf::from("/d/a.conf"),
            model_endpoints: PathBuf::from("/etc/e.json"),
            package_registries: s.package_registries.clone(),
            job_image: Some("pi-job.v2".to_owned()),
            gitlab_url: Some("https://gitlab.example.com".to_owned()),
            provider: Some("fake".to_owned()),
            model: Some("fake-model".to_owned()),
            on_failure: Some(PathBuf::from("/d/bin/page")),
            concurrency: 3,
            time_limit_secs: 600,
            drain_limit_secs: 0,
            worker_labels: vec!["gpu".to_owned(), "zone:eu".to_owned()],
            host_name_setting: Some("builder-1".to_owned()),
            heartbeat_secs: 5,
            transcripts: false,
            egress_nameserver: Some("[2001:db8::53]:53".parse().unwrap()),
            egress_proxy_dir: PathBuf::from("/run/egress"),
            github_api_url: "https://ghe.example.com/api/v3".to_owned(),
            github_url: "https://ghe.example.com".to_owned(),
            github_app_id: Some(42),
            github_app_key_file: Some(PathBuf::from("/d/key.pem")),
            forge_job_user: Some((1000, 1001)),
            queue: QueueBackend::Redis {
                url: "redis://127.0.0.1:6379/0".to_owned(),
            },
            sandbox: SandboxBackend::Podman {
                base: Some("debian:13".to_owned()),
                runtime: Some("crun".to_owned()),
                docker: true,
            },
            publish_file_bytes: 10 << 20,
            publish_bytes: 20 << 20,
            run_check_secs: 30,
            job_pids: 100,
            job_memory_bytes: 128 << 20,
            job_cpu_secs: 60,
            job_disk_bytes: 32 << 20,
            job_uids: (200_000, 200_009),
            disk_warn_bytes: 2 << 20,
            disk_min_bytes: 1 << 20,
            keep: Keep {
                records_days: 30,
                transcripts_days: 7,
                failed_jobs_days: 3,
            },
        };
        assert_eq!(s, want);
        assert_eq!(
            s.package_registries
                .iter()
                .map(|(r, h)| format!("{r}={h}"))
                .collect::<Vec<_>>(),
            ["npx=registry.example.org"]
        );
        let defaults = resolve(&from(&[]), Path::new("/d")).unwrap();
        assert_eq!(
            (
                defaults.egress_proxy_dir,
                defaults.github_api_url,
                defaults.github_url,
                defaults.job_uids,
                defaults.queue,
                defaults.sandbox,
            ),
            (
                PathBuf::from("/d/state/egress"),
                DEFAULT_GITHUB_API_URL.to_owned(),
                DEFAULT_GITHUB_URL.to_owned(),
                DEFAULT_JOB_UIDS,
                QueueBackend::Sqlite,
                SandboxBackend::Bubblewrap,
            )
        );
        assert_eq!(
            (
                defaults.publish_file_bytes,
                defaults.job_memory_bytes,
                defaults.disk_min_bytes,
                defaults.heartbeat_secs,
                defaults.drain_limit_secs,
            ),
            (
                DEFAULT_PUBLISH_FILE_MB << 20,
                DEFAULT_JOB_MEMORY_MB << 20,
                DEFAULT_DISK_MIN_MB << 20,
                DEFAULT_HEARTBEAT_SECS,
                DEFAULT_DRAIN_LIMIT_SECS,
            )
        );
    }

    #[test]
    fn the_pool_of_job_ids_is_a_range_that_holds_no_system_id() {
        assert_eq!(
            parse_id_range("1879048192-1879048447"),
            Some(DEFAULT_JOB_UIDS)
        );
        assert_eq!(parse_id_range("200000-200000"), Some((200000, 200000)));
        for bad in [
            "",
            "5-10",
            "2000-1000",
            "60000-70000",
            "a-b",
            "1000-",
            "+1000-2000",
            "1000-4294967295",
        ] {
            assert_eq!(parse_id_range(bad), None, "{bad}");
        }
    }
}

/// The `PI_` names pi-dispatch reads besides the settings of [`ALL`]: the panel's and the
/// receiver's, and `PI_DIR`.
const OTHER_NAMES: &[&str] = &[
    "PI_PANEL_TOKEN",
    "PI_PANEL_LISTEN",
    "PI_PANEL_TRUSTED_PROXIES",
    "PI_GITHUB_WEBHOOK_SECRET",
    "PI_GITLAB_WEBHOOK_TOKEN",
    "PI_RECEIVER_LISTEN",
    "PI_DIR",
];

/// pi's own `PI_` variables (its documentation's list), which an operator's shell may hold for
/// pi run by hand: none of them is a misspelled setting.
const PI_OWN_NAMES: &[&str] = &[
    "PI_CACHE_RETENTION",
    "PI_CLEAR_ON_SHRINK",
    "PI_CLIPBOARD_OSC52",
    "PI_CODEMODE_MAX_WORKERS",
    "PI_CODING_AGENT_DIR",
    "PI_CODING_AGENT_SESSION_DIR",
    "PI_HARDWARE_CURSOR",
    "PI_HYPERLINKS",
    "PI_IMAGE_PROTOCOL",
    "PI_OFFLINE",
    "PI_PACKAGE_DIR",
    "PI_PROGRAM_STATUS",
    "PI_RADIUS_GATEWAY",
    "PI_REASONING_LEVEL",
    "PI_SELF_UPDATE_COMMAND",
    "PI_SESSION_FILE",
    "PI_SESSION_ID",
    "PI_SHARE_VIEWER_URL",
    "PI_SKIP_VERSION_CHECK",
    "PI_TELEMETRY",
    "PI_TRUE_COLOR",
    "PI_TUI_ESC_TIMEOUT",
];

/// The names among `names` that look like pi-dispatch's (`PI_`) and are none of the names it or pi
/// reads (the runner's own `PI_DISPATCH_` variables aside), each with the known name it probably
/// meant. Sorted, each once.
pub fn unknown_names<I, S>(names: I) -> Vec<(String, Option<&'static str>)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let known: Vec<&'static str> = ALL.iter().chain(OTHER_NAMES).copied().collect();
    let mut out: Vec<(String, Option<&'static str>)> = names
        .into_iter()
        .map(|n| n.as_ref().to_owned())
        .filter(|n| {
            n.starts_with("PI_")
                && !n.starts_with("PI_DISPATCH_")
                && !known.contains(&n.as_str())
                && !PI_OWN_NAMES.contains(&n.as_str())
        })
        .map(|n| {
            let meant = crate::triggers::near_miss(&n, &known);
            (n, meant)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod unknown_tests {
    use super::*;

    #[test]
    fn a_misspelled_setting_is_named_with_the_one_it_meant() {
        let found = unknown_names([
            "PI_WORKER_CONCURENCY",
            "PI_JOB_TIMELIMIT",
            "PI_WORKER_CONCURRENCY",
            "PI_CODING_AGENT_DIR",
            "PI_DISPATCH_MODELS",
            "PATH",
            "PI_SOMETHING_ELSE_ENTIRELY",
            "PI_WORKER_CONCURENCY",
        ]);
        assert_eq!(
            found,
            [
                ("PI_JOB_TIMELIMIT".to_owned(), Some(TIME_LIMIT_SETTING)),
                ("PI_SOMETHING_ELSE_ENTIRELY".to_owned(), None),
                ("PI_WORKER_CONCURENCY".to_owned(), Some(CONCURRENCY_SETTING)),
            ]
        );
    }
}
