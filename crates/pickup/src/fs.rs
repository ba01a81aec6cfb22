//! The admission's readers on a real deployment: files read without following links, images from
//! `images/NAME/` (the runner and `image.json`'s labels), the job's folder, and the worker's
//! environment. A read error that may pass later (EIO and the like) becomes a retry, never a
//! refusal. [`Deployment`] bundles them, so every caller decides the same way.

use std::path::{Path, PathBuf};

use config::files::{self, ReadError};
use config::settings::Settings;
use protocol::job::Job;

use crate::admission::{
    self, Decision, Files, Folder, Folders, Host, Image, Images, Inputs, Read, WorkerEnv,
};

/// The largest file the admission reads.
const LIMIT: usize = config::mcp::MAX_FILE_BYTES;

/// Sorts a read's outcome into the admission's terms.
pub fn classify(result: Result<Vec<u8>, ReadError>) -> Read {
    match result {
        Ok(bytes) => Read::Bytes(bytes),
        Err(ReadError::Missing) => Read::Missing,
        Err(e) if e.may_pass_on_retry() => Read::Transient(e.to_string()),
        Err(e) => Read::Failed(e.to_string()),
    }
}

/// The deployment's files, where its settings put them.
pub struct DeploymentFiles {
    triggers: PathBuf,
    overlay: PathBuf,
    allowlist: PathBuf,
    endpoints: PathBuf,
}

impl DeploymentFiles {
    pub fn new(settings: &Settings) -> DeploymentFiles {
        DeploymentFiles {
            triggers: settings.triggers_file.clone(),
            overlay: settings.overlay_dir.clone(),
            allowlist: settings.egress_allowlist.clone(),
            endpoints: settings.model_endpoints.clone(),
        }
    }
}

impl Files for DeploymentFiles {
    fn triggers(&self) -> Read {
        classify(files::read_file(
            &self.triggers,
            config::triggers::MAX_FILE_BYTES,
        ))
    }

    fn overlay_mcp(&self) -> Read {
        classify(files::read_file(&self.overlay.join("mcp.json"), LIMIT))
    }

    fn overlay_models(&self) -> Read {
        classify(files::read_file(&self.overlay.join("models.json"), LIMIT))
    }

    fn allowlist(&self) -> Read {
        classify(files::read_file(&self.allowlist, LIMIT))
    }

    fn endpoints(&self) -> Read {
        classify(files::read_file(&self.endpoints, LIMIT))
    }
}

/// The embedded backend's images: folders `images/NAME/` of the deployment, each with the runner
/// and an `image.json` of `{"labels": {NAME: VALUE, ...}}`.
pub struct ImageFolders {
    root: PathBuf,
}

impl ImageFolders {
    pub fn new(deployment: &Path) -> ImageFolders {
        ImageFolders {
            root: deployment.join("images"),
        }
    }

    /// The folder of image `name`, when it is an image name.
    pub fn folder(&self, name: &str) -> Option<PathBuf> {
        // A name from the queue is judged again: `..` or a path must not reach another folder.
        config::settings::is_image_name(name).then(|| self.root.join(name))
    }
}

impl Images for ImageFolders {
    fn image(&self, name: &str) -> Image {
        let Some(dir) = self.folder(name) else {
            return Image::Missing;
        };
        match std::fs::metadata(dir.join(protocol::image::RUNNER)) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Image::Missing,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Image::Missing,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Image::Missing,
            Err(e) => return Image::Transient(format!("cannot be read ({})", e.kind())),
        }
        match classify(files::read_file(
            &dir.join(protocol::image::LABELS_FILE),
            1024 * 1024,
        )) {
            // An image without the file, or with a file that is not right, declares nothing.
            Read::Missing | Read::Failed(_) => Image::Installed {
                capabilities: Vec::new(),
            },
            Read::Transient(why) => Image::Transient(why),
            Read::Bytes(bytes) => Image::Installed {
                capabilities: protocol::image::capabilities_of(&bytes),
            },
        }
    }
}

/// Folders on this host, by their metadata (links followed: the job's folder may be given through
/// one; what the sandbox binds is the folder itself).
pub struct HostFolders;

impl Folders for HostFolders {
    fn folder(&self, path: &str) -> Folder {
        use std::os::unix::fs::MetadataExt as _;
        let path = Path::new(path);
        if !path.is_absolute() {
            return Folder::Failed("is not an absolute path".to_owned());
        }
        match std::fs::metadata(path) {
            Ok(m) if !m.is_dir() => Folder::NotAFolder,
            Ok(m) => Folder::Folder {
                uid: m.uid(),
                gid: m.gid(),
                mode: m.mode(),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Folder::Missing,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Folder::Failed(
                "cannot be reached by the worker's user (permission denied)".to_owned(),
            ),
            Err(e) => Folder::Transient(format!("cannot be read ({})", e.kind())),
        }
    }
}

/// The deployment's environment, as every command sees it: the process environment over the
/// deployment folder's `.env` (the same order as the settings), a variable counting when it holds
/// a non-empty value. The worker takes the provider's key and the forwarded variables from it, and
/// `run`, `explain` and `doctor` judge with it, so they agree when they run where the worker runs.
#[derive(Clone, Default)]
pub struct Environment {
    dotenv: config::dotenv::Dotenv,
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Environment({} names in .env)", self.dotenv.len())
    }
}

impl Environment {
    pub fn new(dotenv: config::dotenv::Dotenv) -> Environment {
        Environment { dotenv }
    }

    /// A variable's value, when it holds one.
    pub fn get(&self, name: &str) -> Option<String> {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .or_else(|| self.dotenv.get(name).filter(|v| !v.is_empty()).cloned())
    }
}

impl WorkerEnv for Environment {
    fn has_value(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
}

/// A deployment's readers, as every caller of the admission uses them.
pub struct Deployment<'a> {
    pub settings: &'a Settings,
    pub env: &'a Environment,
    pub files: DeploymentFiles,
    pub images: Box<dyn Images>,
    pub host: Host,
}

/// The container backend's images, as the engine has them (`image build NAME` made them): their
/// labels read with `podman image inspect`, once for each job judged.
pub struct EngineImages {
    pub podman: PathBuf,
}

impl Images for EngineImages {
    fn image(&self, name: &str) -> Image {
        if !config::settings::is_image_name(name) {
            return Image::Missing;
        }
        match engine_labels(&self.podman, name) {
            Ok(None) => Image::Missing,
            Err(why) => Image::Transient(why),
            Ok(Some(labels)) => {
                let file = serde_json::json!({ "labels": labels }).to_string();
                Image::Installed {
                    capabilities: protocol::image::capabilities_of(file.as_bytes()),
                }
            }
        }
    }
}

/// The labels of the container engine's image `name` (as `image build` made it), the one way they
/// are read: `Ok(None)` when the engine does not have the image; an error for anything that may
/// pass (the engine cannot be run, or its storage is busy).
pub fn engine_labels(engine: &Path, name: &str) -> Result<Option<serde_json::Value>, String> {
    let out = std::process::Command::new(engine)
        .args(["image", "inspect", "--format", "{{json .Config.Labels}}"])
        .arg(protocol::image::container_ref(name))
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("{} cannot be run ({})", engine.display(), e.kind()))?;
    if !out.status.success() {
        // The engine says "image not known" for an image it does not have.
        let said = String::from_utf8_lossy(&out.stderr).to_lowercase();
        return if said.contains("image not known") || said.contains("no such image") {
            Ok(None)
        } else {
            Err(format!(
                "{} could not read the image's labels",
                engine.display()
            ))
        };
    }
    Ok(Some(
        serde_json::from_slice(&out.stdout).unwrap_or_default(),
    ))
}

impl<'a> Deployment<'a> {
    /// With whether the GitHub App's key can sign (`None`: no key file is set), as the worker that
    /// would mint the job's token reads it: a github job is refused when it cannot.
    pub fn with_github_key(mut self, usable: Option<bool>) -> Deployment<'a> {
        self.host.github_key = usable;
        self
    }

    /// The deployment of `settings` on this host (the worker's own user decides whether it runs
    /// as root).
    pub fn new(settings: &'a Settings, env: &'a Environment) -> Deployment<'a> {
        Deployment {
            settings,
            env,
            files: DeploymentFiles::new(settings),
            images: match &settings.sandbox {
                config::settings::SandboxBackend::Podman { base: None, .. } => {
                    Box::new(EngineImages {
                        podman: PathBuf::from(settings.sandbox.engine_or_podman()),
                    })
                }
                _ => Box::new(ImageFolders::new(&settings.dir)),
            },
            host: Host {
                root: rustix::process::geteuid().is_root(),
                user: crate::reach::User {
                    uid: rustix::process::geteuid().as_raw(),
                    gid: rustix::process::getegid().as_raw(),
                    groups: rustix::process::getgroups()
                        .map(|g| g.iter().map(|g| g.as_raw()).collect())
                        .unwrap_or_default(),
                },
                passwd: std::fs::read_to_string("/etc/passwd").ok(),
                // This version has an egress proxy: the worker makes sure one serves its jobs.
                egress_proxy: true,
                // Told by the caller ([`Deployment::with_github_key`]), which reads the key.
                github_key: None,
            },
        }
    }

    fn inputs<'j>(&'j self, job: &'j Job) -> Inputs<'j> {
        Inputs {
            job,
            settings: self.settings,
            files: &self.files,
            images: &*self.images,
            folders: &HostFolders,
            env: self.env,
            host: &self.host,
        }
    }

    /// The admission's decision for `job`.
    pub fn decide(&self, job: &Job) -> Decision {
        admission::decide(&self.inputs(job))
    }

    /// The deployment's default provider and model (`PI_PROVIDER`, `PI_MODEL`), judged as a job's.
    pub fn default_model(&self) -> Result<protocol::admitted::ModelChoice, Decision> {
        admission::model_check(&self.inputs(&Job::new("doctor", "cli", "local")))
    }
}

/// Writes the job's `mcp.json` into the job folder `dir`, read-only (0444), whole or not at all:
/// written under a temporary name, flushed, then linked into place (never over an existing file).
pub fn write_job_mcp(dir: &Path, file: &protocol::job_mcp::JobMcpFile) -> std::io::Result<PathBuf> {
    let target = dir.join("mcp.json");
    if files::create_new(&target, file.text.as_bytes(), 0o444)? {
        Ok(target)
    } else {
        Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists))
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    #[test]
    fn read_errors_that_may_pass_become_retries() {
        assert_eq!(
            classify(Err(ReadError::Io(io::ErrorKind::Other))),
            Read::Transient("cannot be read (other error)".into())
        );
        assert!(matches!(
            classify(Err(ReadError::Io(io::ErrorKind::Interrupted))),
            Read::Transient(_)
        ));
        assert!(matches!(classify(Err(ReadError::Link)), Read::Failed(_)));
        assert!(matches!(
            classify(Err(ReadError::Io(io::ErrorKind::PermissionDenied))),
            Read::Failed(_)
        ));
        assert_eq!(classify(Err(ReadError::Missing)), Read::Missing);
    }

    #[test]
    fn the_job_file_is_written_read_only_and_whole() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = protocol::job_mcp::JobMcpFile::new(
            &[],
            Some(&protocol::job_mcp::Forge::Github { host: None }),
            true,
        );
        let path = write_job_mcp(dir.path(), &file).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(protocol::job_mcp::digest(&bytes), file.digest);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o444);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // Never over an existing file.
        assert!(write_job_mcp(dir.path(), &file).is_err());
    }

    #[test]
    fn image_folders_read_their_runner_and_labels() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("images/pi-job");
        std::fs::create_dir_all(image.join("bin")).unwrap();
        std::fs::write(
            image.join("image.json"),
            r#"{"labels": {"dev.pi-dispatch.capabilities": "mcp"}}"#,
        )
        .unwrap();
        let images = ImageFolders::new(dir.path());
        // Labels without the runner: not installed.
        assert_eq!(images.image("pi-job"), Image::Missing);
        std::fs::write(image.join("bin/pi-dispatch"), "").unwrap();
        assert_eq!(
            images.image("pi-job"),
            Image::Installed {
                capabilities: vec!["mcp".into()]
            }
        );
        assert_eq!(images.image("other"), Image::Missing);
        assert_eq!(images.image(".."), Image::Missing);
        assert_eq!(images.image("../images/pi-job"), Image::Missing);
    }

    #[test]
    fn host_folders_tell_missing_files_and_owners() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "").unwrap();
        let at = |p: &Path| HostFolders.folder(p.to_str().unwrap());
        assert!(matches!(at(dir.path()), Folder::Folder { .. }));
        assert_eq!(at(&file), Folder::NotAFolder);
        assert_eq!(at(&dir.path().join("nope")), Folder::Missing);
        assert!(matches!(HostFolders.folder("relative"), Folder::Failed(_)));
    }
}
