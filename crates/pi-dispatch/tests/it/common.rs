//! Running the binary in a scratch deployment folder.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A scratch deployment folder that the binary runs in, with its environment cleared of settings.
pub struct Deployment {
    pub dir: tempfile::TempDir,
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Deployment {
    pub fn new() -> Deployment {
        Deployment {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `text` at `rel` under the folder, creating parent folders.
    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pi-dispatch"));
        cmd.args(args)
            .current_dir(self.path())
            .env_remove("PI_GLOBAL_PI_DIR")
            .env("NO_COLOR", "1");
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Run {
        Run::from(self.command(args).output().unwrap())
    }

    /// Output with the folder's path replaced by `[DIR]`, for snapshots.
    pub fn redact(&self, text: &str) -> String {
        let real = self.path().canonicalize().unwrap();
        text.replace(&real.display().to_string(), "[DIR]")
            .replace(&self.path().display().to_string(), "[DIR]")
    }
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8(o.stdout).unwrap(),
            stderr: String::from_utf8(o.stderr).unwrap(),
        }
    }
}
