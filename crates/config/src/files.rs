//! Reading a configuration file whole, safely: never through a link, never more than a cap, and with
//! failures sorted into those that are final (missing, a link, not a file, too large) and those that
//! may pass on a retry (an I/O error such as EIO).
//!
//! This is the one place the config crate touches the file system; everything else parses bytes.

use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error("not found")]
    Missing,
    #[error("is a link; pi-dispatch does not follow links in configuration")]
    Link,
    #[error("is not a regular file")]
    NotAFile,
    #[error("is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("cannot be read ({0})")]
    Io(io::ErrorKind),
}

impl ReadError {
    /// Whether the same read may succeed later (a transient I/O error), rather than being final.
    pub fn may_pass_on_retry(&self) -> bool {
        matches!(self, ReadError::Io(kind) if !matches!(kind, io::ErrorKind::PermissionDenied))
    }

    pub fn code(&self) -> &'static str {
        match self {
            ReadError::Missing => "file-missing",
            ReadError::Link => "file-link",
            ReadError::NotAFile => "file-not-regular",
            ReadError::TooLarge { .. } => "file-too-large",
            ReadError::Io(_) => "file-unreadable",
        }
    }
}

/// Reads `path` whole, refusing a link at its last component and anything over `limit` bytes.
pub fn read_file(path: &Path, limit: usize) -> Result<Vec<u8>, ReadError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ReadError::Missing,
            // O_NOFOLLOW on a link fails with ELOOP.
            _ if e.raw_os_error() == Some(libc::ELOOP) => ReadError::Link,
            kind => ReadError::Io(kind),
        })?;
    let meta = file.metadata().map_err(|e| ReadError::Io(e.kind()))?;
    if !meta.is_file() {
        return Err(ReadError::NotAFile);
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0).min(limit));
    file.take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ReadError::Io(e.kind()))?;
    if bytes.len() > limit {
        return Err(ReadError::TooLarge { limit });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_file_and_sorts_failures() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mcp.json");
        std::fs::write(&file, b"{}").unwrap();
        assert_eq!(read_file(&file, 10).unwrap(), b"{}");
        assert!(matches!(
            read_file(&file, 1),
            Err(ReadError::TooLarge { limit: 1 })
        ));
        assert!(matches!(
            read_file(&dir.path().join("none"), 10),
            Err(ReadError::Missing)
        ));
        assert!(matches!(
            read_file(dir.path(), 10),
            Err(ReadError::NotAFile)
        ));
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let err = read_file(&link, 10).unwrap_err();
        assert!(matches!(err, ReadError::Link), "{err:?}");
        assert!(!err.may_pass_on_retry());
        assert!(ReadError::Io(io::ErrorKind::Other).may_pass_on_retry());
    }
}
