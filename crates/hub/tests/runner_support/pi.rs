//! Real pi in a job: the job's folders, its files as the worker writes them, and the runner run
//! with pi as its agent, without the worker's confinement (the hub's tests run on the host).

use std::path::{Path, PathBuf};

use hub::job::{Agent, JobOptions, run};
use hub::pi_agent::PiOptions;
use protocol::exit_line::ExitLine;
use protocol::job_dir::RunnerInput;
use protocol::job_mcp::JobMcpFile;

use super::bounded;

/// A job's folders: the job's files, the workspace, the overlay and pi's private agent folder.
pub struct Folders {
    _root: tempfile::TempDir,
    pub job: PathBuf,
    pub workspace: PathBuf,
    pub overlay: PathBuf,
    pub agent: PathBuf,
    pub home: PathBuf,
}

pub fn folders() -> Folders {
    let root = tempfile::tempdir().unwrap();
    let at = |name: &str| {
        let p = root.path().join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    Folders {
        job: at("job"),
        workspace: at("workspace"),
        overlay: at("overlay"),
        agent: root.path().join("home/.pi-dispatch/agent"),
        home: at("home"),
        _root: root,
    }
}

pub fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// One job of pi: its id, the job's `mcp.json`, its prompt, the overlay's `models.json`, its
/// model (`provider/id`), the worker's variables beyond `PATH` (Node first) and pi's offline
/// switches, and the runner's input (with the file's digest added).
pub struct PiJob<'a> {
    pub id: &'a str,
    pub file: &'a JobMcpFile,
    pub prompt: &'a str,
    pub models_json: &'a str,
    pub model: &'a str,
    pub vars: &'a [(&'a str, &'a str)],
    pub input: RunnerInput,
}

/// How pi reaches the hub in a test job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Through the relay pi starts for each server, as every job of the product's (and pi
    /// started while the servers connect).
    Relay,
    /// Over loopback HTTP, once every server is connected (a runner with no relay to offer).
    Http,
}

/// The relay program of these tests: `pi-dispatch job-relay` as the hub's own binary.
pub fn relay_program() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hub-job-relay"))
}

/// Writes the job's files in `f` and runs the runner with pi, through the relay, under the tests'
/// bound.
pub async fn run_pi_job(f: &Folders, job: PiJob<'_>) -> ExitLine {
    run_pi_job_over(f, job, Transport::Relay).await
}

/// [`run_pi_job`], with pi reaching the hub over `transport`.
pub async fn run_pi_job_over(f: &Folders, job: PiJob<'_>, transport: Transport) -> ExitLine {
    // A file with no text: a job that names no server (no mcp.json, no digest).
    let servers = !job.file.text.is_empty();
    if servers {
        write(&f.job.join("mcp.json"), &job.file.text);
    }
    write(&f.job.join("prompt.md"), job.prompt);
    write(&f.overlay.join("models.json"), job.models_json);
    let node_dir = testkit::node()
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let path = format!("{node_dir}:/usr/bin:/bin");
    let mut vars = vec![
        ("PATH", path.as_str()),
        ("PI_OFFLINE", "1"),
        ("PI_SKIP_VERSION_CHECK", "1"),
    ];
    vars.extend_from_slice(job.vars);
    let input = RunnerInput {
        mcp_digest: servers.then(|| job.file.digest.clone()),
        ..job.input
    };
    let env = super::runner_env(&f.home, &vars);
    let options = JobOptions {
        job_id: job.id.to_owned(),
        input,
        job_dir: f.job.clone(),
        workspace: f.workspace.clone(),
        agent_dir: f.agent.clone(),
        agent: Agent::Pi(PiOptions {
            node: testkit::node(),
            package: testkit::pi_package(),
            prompt: f.job.join("prompt.md"),
            model: Some(job.model.to_owned()),
            overlay: Some(f.overlay.clone()),
            compile_cache: None,
        }),
        env,
        guard: None,
        confine: None,
        relay: match transport {
            Transport::Relay => Some(relay_program()),
            Transport::Http => None,
        },
        key: None,
    };
    bounded(run(options)).await
}

/// Every file under `dir`, at any depth.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
