//! `init`: writes the deployment folder's missing files, and never overwrites one.

use std::io;
use std::path::{Path, PathBuf};

use config::settings::Settings;

use crate::fsutil::{self, Kind};

/// What `init` did with one file or folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Wrote,
    Made,
    /// Something is already there; it was left as it is.
    Left,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub path: PathBuf,
    pub action: Action,
}

const ENV: &str = "\
# pi-dispatch settings for this deployment folder.
# A variable set in the process environment wins over this file; an empty value counts as unset.

# The overlay folder, mounted read-only in every job (an absolute path). Default: ./pi-global
# PI_GLOBAL_PI_DIR=

# The triggers file. Default: ./triggers.json
# PI_TRIGGERS_FILE=

# The egress policy: 1 or empty (on, the default) or 0 (off). With it on, a job reaches only the
# hosts in egress-allowlist.conf (on port 443) and the endpoints in model-endpoints.json.
# PI_EGRESS=1

# Host variables forwarded into every job, by name, separated by commas (values stay on the host
# until a job starts).
# PI_FORWARD_ENV=

# Where the egress files are. Defaults: ./egress-allowlist.conf and ./model-endpoints.json
# PI_EGRESS_ALLOWLIST=
# PI_MODEL_ENDPOINTS=

# The registry host each package runner fetches from, for servers started with one (no host is
# built in). With egress on, a job naming such a server is refused unless its host is declared here
# and allowlisted. Example: npx=registry.example.org,uvx=pypi.example.org
# PI_PACKAGE_REGISTRIES=

# The job image (a folder images/NAME/ of this deployment) for triggers that name none.
# PI_JOB_IMAGE=

# Your GitLab's address, for gitlab triggers (and the forge's own MCP server of their jobs).
# GITLAB_URL=

# The model of jobs whose trigger names none: a provider (as in pi's models.json) and a model id.
# PI_PROVIDER=
# PI_MODEL=

# A program run when a job stops after it cost something: PROGRAM JOB_ID OUTCOME REASON HOST.
# PI_ON_FAILURE=

# How many jobs the worker runs at once (1 to 64), and each job's time limit in seconds.
# PI_WORKER_CONCURRENCY=1
# PI_JOB_TIME_LIMIT=3600

# Seconds a worker told to stop (SIGTERM, SIGINT) lets its running jobs finish before it stops
# them and hands them back to the queue.
# PI_WORKER_DRAIN_LIMIT=120

# The labels this host's workers take jobs for, comma-separated (a trigger's run.labels asks for
# them); every worker also carries host:NAME. NAME is this host's name in the queue (the system's
# host name unless set): a local job queued here runs only on a worker of this host.
# PI_WORKER_LABELS=gpu, zone:eu
# PI_HOST_NAME=build-1

# How often a worker tells the queue it is alive, in seconds; unseen for three, it is shown gone.
# PI_WORKER_HEARTBEAT_SECS=10

# Keep each job's transcript (pi's events, secrets redacted) in state/jobs/ID/: 1 (on) or 0 (off).
# PI_TRANSCRIPTS=1

# The egress proxy (egress on): the one nameserver it asks, as IP:PORT (default: this machine's
# resolver), and the folder of its control socket, for workers of several deployments on one host
# that share one proxy (default: ./state/egress).
# PI_EGRESS_NAMESERVER=
# PI_EGRESS_PROXY_DIR=

# Forge jobs (docs/forges.md). GitHub: the App the worker mints each job's token as (its id, and
# the path of its private key file, mode 0600), the API (GitHub Enterprise: https://HOST/api/v3)
# and where repositories are cloned from. Defaults: GitHub's own.
# PI_GITHUB_APP_ID=
# PI_GITHUB_APP_KEY_FILE=
# PI_GITHUB_API_URL=
# PI_GITHUB_URL=
# GitLab: GITLAB_URL above, and the token the worker acts with (a bot's, with the Developer role).
# PI_GITLAB_TOKEN=
# The user a forge job runs as under a root worker, as UID:GID. Default: 65534:65534 (nobody).
# PI_FORGE_JOB_USER=
# What a fix job's work tree may hold to be published, in MiB: its largest file, and all its
# files together (a sparse file counts its whole size). Defaults: 100 and 2048.
# PI_JOB_PUBLISH_FILE_MB=100
# PI_JOB_PUBLISH_MB=2048
# Seconds `pi-dispatch run` may take to check a folder for uncommitted changes (git runs in a
# sandbox of its own for it; a folder it cannot check in time is not queued). Default: 60.
# PI_RUN_CHECK_TIME_LIMIT=60
# Each job's bounds, kept by the kernel (docs/sandbox.md): processes and threads at once, memory
# in MiB (what its /tmp holds counts), and CPU time of all its processes together in seconds.
# A job that reaches one is stopped, and its record names the limit.
# PI_JOB_PIDS=1024
# PI_JOB_MEMORY_MB=4096
# PI_JOB_CPU_SECS=7200
# What each job may write into its workspace, in MiB: its writes go to a disk of their own that
# size, and are copied into the workspace when the job ends (not kept if it filled the disk).
# PI_JOB_DISK_MB=4096
# The ids (uid and gid) a root worker runs its jobs as, one for each running job, FIRST-LAST: no
# user, group or other process of this host may use them.
# PI_JOB_UIDS=1879048192-1879048447
# Free space, in MiB, on the file system of the deployment's state (records, transcripts, job
# folders, the queue): below the first doctor warns; below the second doctor fails and the worker
# starts no job (they wait in the queue) until there is room again.
# PI_DISK_WARN_MB=4096
# PI_DISK_MIN_MB=1024
# How long what jobs leave is kept, in days: run records (the metrics keep counting what was
# pruned), transcripts (never longer than records), and the folder of a job that did not complete
# (its clone and what it wrote; 0 removes it once the job is settled, as a completed job's is).
# The worker prunes as it goes; `pi-dispatch prune --dry-run` shows what it would remove.
# PI_KEEP_RECORDS_DAYS=365
# PI_KEEP_TRANSCRIPTS_DAYS=30
# PI_KEEP_FAILED_JOBS_DAYS=0
# The queue: sqlite (the default: state/queue.sqlite3), or one Redis shared by the workers of
# several hosts, as redis://HOST:PORT/DB (rediss:// with TLS). Its password, if it has one, goes in
# PI_QUEUE_PASSWORD (in the worker's environment file), never in the URL.
# PI_QUEUE=
# PI_QUEUE_PASSWORD=
# The receiver (pi-dispatch receiver): the webhooks' secrets, and where it listens
# (default: 127.0.0.1:8780).
# PI_GITHUB_WEBHOOK_SECRET=
# PI_GITLAB_WEBHOOK_TOKEN=
# PI_RECEIVER_LISTEN=

# The sandbox each job runs in: bubblewrap (the default), podman, or docker (docs/sandbox.md).
# A container job runs the image `pi-dispatch image build` made of its job image, unless
# PI_PODMAN_IMAGE names one image for every job; PI_PODMAN_RUNTIME picks the OCI runtime.
# PI_SANDBOX=
# PI_PODMAN_IMAGE=
# PI_PODMAN_RUNTIME=

# The panel (pi-dispatch panel): the token its login asks for (at least 16 characters; keep it in
# this file or the service's environment, never on a command line), and where it listens
# (default: 127.0.0.1:8790).
# PI_PANEL_TOKEN=
# PI_PANEL_LISTEN=
";

const TRIGGERS: &str = "{\n  \"triggers\": []\n}\n";

const ALLOWLIST: &str = "\
# Hosts a job may reach on port 443 through the egress proxy, one a line.
# A leading dot allows a name's subdomains: .example.com allows api.example.com, not example.com.
# Names are not looked up; localhost and 127.0.0.1 are never reachable through the proxy.
";

const ENDPOINTS: &str = "{\n  \"version\": 1,\n  \"endpoints\": []\n}\n";

/// Writes what is missing of the deployment described by `settings`.
pub fn init(settings: &Settings) -> io::Result<Vec<Step>> {
    std::fs::create_dir_all(&settings.dir)?;
    let mut steps = Vec::new();
    for (path, text, mode) in [
        (settings.dir.join(".env"), ENV, 0o600),
        (settings.triggers_file.clone(), TRIGGERS, 0o644),
        (settings.egress_allowlist.clone(), ALLOWLIST, 0o644),
        (settings.model_endpoints.clone(), ENDPOINTS, 0o644),
    ] {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let action = if fsutil::create_new(&path, text.as_bytes(), mode)? {
            Action::Wrote
        } else {
            Action::Left
        };
        steps.push(Step { path, action });
    }
    steps.push(make_dir(&settings.overlay_dir)?);
    Ok(steps)
}

fn make_dir(path: &Path) -> io::Result<Step> {
    let action = match fsutil::kind(path)? {
        Kind::Missing => {
            std::fs::create_dir_all(path)?;
            Action::Made
        }
        _ => Action::Left,
    };
    Ok(Step {
        path: path.to_owned(),
        action,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path) -> Settings {
        config::settings::resolve(&|_| None, dir).unwrap()
    }

    #[test]
    fn writes_what_is_missing_and_leaves_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("triggers.json"), b"mine").unwrap();
        let steps = init(&settings(dir.path())).unwrap();
        let actions: Vec<(&str, &Action)> = steps
            .iter()
            .map(|s| (s.path.file_name().unwrap().to_str().unwrap(), &s.action))
            .collect();
        assert_eq!(
            actions,
            [
                (".env", &Action::Wrote),
                ("triggers.json", &Action::Left),
                ("egress-allowlist.conf", &Action::Wrote),
                ("model-endpoints.json", &Action::Wrote),
                ("pi-global", &Action::Made),
            ]
        );
        assert_eq!(
            std::fs::read(dir.path().join("triggers.json")).unwrap(),
            b"mine"
        );
        // A second run changes nothing.
        let again = init(&settings(dir.path())).unwrap();
        assert!(again.iter().all(|s| s.action == Action::Left));
    }

    #[test]
    fn what_init_writes_reads_back_cleanly() {
        let parsed = config::dotenv::parse(ENV).unwrap();
        assert!(parsed.is_empty(), "every setting is commented out");
        for name in config::settings::ALL {
            assert!(
                ENV.contains(&format!("# {name}=")),
                "{name} missing from .env"
            );
        }
        assert!(config::json::parse(TRIGGERS).is_ok());
        assert!(
            config::egress::parse_allowlist(ALLOWLIST)
                .unwrap()
                .is_empty()
        );
        let endpoints = config::endpoints::parse_model_endpoints(ENDPOINTS).unwrap();
        assert!(endpoints.endpoints.is_empty());
    }
}
