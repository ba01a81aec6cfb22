//! The gates' readers on a real deployment: files read without following links, image labels from
//! `images/NAME/image.json`, and the worker's environment. A read error that may pass later (EIO and
//! the like) becomes [`Read::Transient`], so the job is retried rather than refused.

use std::path::{Path, PathBuf};

use config::files::{self, ReadError};
use config::json::{self, Json};
use config::settings::Settings;

use crate::gates::{Capabilities, Files, ImageLabels, Read, WorkerEnv};

/// The largest file the gates read.
const LIMIT: usize = config::mcp::MAX_FILE_BYTES;

/// The image label that lists an image's capabilities.
pub const CAPABILITIES_LABEL: &str = "dev.pi-dispatch.capabilities";

/// Sorts a read's outcome into the gates' terms.
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
    overlay: PathBuf,
    allowlist: PathBuf,
    endpoints: PathBuf,
}

impl DeploymentFiles {
    pub fn new(settings: &Settings) -> DeploymentFiles {
        DeploymentFiles {
            overlay: settings.overlay_dir.clone(),
            allowlist: settings.egress_allowlist.clone(),
            endpoints: settings.model_endpoints.clone(),
        }
    }
}

impl Files for DeploymentFiles {
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

/// The embedded backend's images: folders `images/NAME/` of the deployment, each with an
/// `image.json` of `{"labels": {NAME: VALUE, ...}}`.
pub struct ImageFolders {
    root: PathBuf,
}

impl ImageFolders {
    pub fn new(deployment: &Path) -> ImageFolders {
        ImageFolders {
            root: deployment.join("images"),
        }
    }
}

impl ImageLabels for ImageFolders {
    fn capabilities(&self, image: &str) -> Capabilities {
        // A name from the queue is judged again: `..` or a path must not reach another folder.
        if !config::settings::is_image_name(image) {
            return Capabilities::Declared(Vec::new());
        }
        let path = self.root.join(image).join("image.json");
        match classify(files::read_file(&path, 1024 * 1024)) {
            // An image without the file, or with a file that is not right, declares nothing.
            Read::Missing | Read::Failed(_) => Capabilities::Declared(Vec::new()),
            Read::Transient(why) => Capabilities::Transient(why),
            Read::Bytes(bytes) => Capabilities::Declared(capabilities_of(&bytes)),
        }
    }
}

/// The capabilities an `image.json` declares: the comma-separated label, empty when the file or
/// the label is not as it should be.
pub fn capabilities_of(bytes: &[u8]) -> Vec<String> {
    let Some(label) = std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| json::parse(t).ok())
        .and_then(|root| {
            root.as_object()?
                .get("labels")?
                .as_object()?
                .get(CAPABILITIES_LABEL)
                .and_then(Json::as_str)
                .map(str::to_owned)
        })
    else {
        return Vec::new();
    };
    label
        .split(',')
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Writes the job's `mcp.json` into the job folder `dir`, read-only (0444), whole or not at all:
/// written under a temporary name, flushed, then linked into place (never over an existing file).
pub fn write_job_mcp(dir: &Path, file: &crate::job_mcp::JobMcpFile) -> std::io::Result<PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let target = dir.join("mcp.json");
    let tmp = dir.join(format!(".mcp.json.{}.tmp", std::process::id()));
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let written = out
        .write_all(file.text.as_bytes())
        .and_then(|()| out.sync_all())
        .and_then(|()| std::fs::hard_link(&tmp, &target));
    let _ = std::fs::remove_file(&tmp);
    written.map(|()| target)
}

/// The worker's environment: a variable counts when it holds a non-empty value.
pub struct ProcessEnv;

impl WorkerEnv for ProcessEnv {
    fn has_value(&self, name: &str) -> bool {
        std::env::var_os(name).is_some_and(|v| !v.is_empty())
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
    fn capabilities_come_from_the_label() {
        assert_eq!(
            capabilities_of(br#"{"labels": {"dev.pi-dispatch.capabilities": "mcp,forgeMcp", "dev.pi-dispatch.pi-version": "1.6.0"}}"#),
            ["mcp", "forgeMcp"]
        );
        for nothing in [
            &b"{}"[..],
            br#"{"labels": {}}"#,
            b"not json",
            br#"{"labels": {"dev.pi-dispatch.capabilities": 5}}"#,
        ] {
            assert!(capabilities_of(nothing).is_empty());
        }
    }

    #[test]
    fn the_job_file_is_written_read_only_and_whole() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = crate::job_mcp::JobMcpFile::new(&[], Some(&crate::job_mcp::Forge::Github), true);
        let path = write_job_mcp(dir.path(), &file).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(crate::job_mcp::digest(&bytes), file.digest);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o444);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // Never over an existing file.
        assert!(write_job_mcp(dir.path(), &file).is_err());
    }

    #[test]
    fn image_folders_read_their_image_json() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("images/pi-job")).unwrap();
        std::fs::write(
            dir.path().join("images/pi-job/image.json"),
            r#"{"labels": {"dev.pi-dispatch.capabilities": "mcp"}}"#,
        )
        .unwrap();
        let images = ImageFolders::new(dir.path());
        assert_eq!(
            images.capabilities("pi-job"),
            Capabilities::Declared(vec!["mcp".into()])
        );
        assert_eq!(images.capabilities("other"), Capabilities::Declared(vec![]));
        std::fs::write(
            dir.path().join("image.json"),
            r#"{"labels": {"dev.pi-dispatch.capabilities": "mcp"}}"#,
        )
        .unwrap();
        assert_eq!(images.capabilities(".."), Capabilities::Declared(vec![]));
        assert_eq!(
            images.capabilities("../images/pi-job"),
            Capabilities::Declared(vec![])
        );
    }
}
