//! What every command may read of the process: the current folder, the environment, and the
//! deployment's `.env` (read only when a command asks for a setting).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use config::dotenv::{self, Dotenv};

pub struct Context {
    pub cwd: PathBuf,
    env: fn(&str) -> Option<String>,
}

impl Context {
    pub fn from_process() -> anyhow::Result<Context> {
        let cwd = std::env::current_dir().context("cannot read the current folder")?;
        Ok(Context {
            cwd,
            env: |name| std::env::var(name).ok(),
        })
    }

    /// A setting's value: the environment's, else the `.env`'s. The `.env` is read only when the
    /// environment does not decide, so a broken `.env` does not stop a command that never needs it.
    pub fn setting(&self, name: &str) -> anyhow::Result<Option<String>> {
        let env = (self.env)(name).filter(|v| !v.is_empty());
        if env.is_some() {
            return Ok(env);
        }
        Ok(config::settings::lookup(name, None, &self.dotenv()?))
    }

    /// The `.env` of the deployment folder (the current folder); empty when there is none.
    fn dotenv(&self) -> anyhow::Result<Dotenv> {
        let path = self.cwd.join(".env");
        match config::files::read_file(&path, 1024 * 1024) {
            Ok(bytes) => {
                let text = String::from_utf8(bytes)
                    .map_err(|_| anyhow::anyhow!(".env is not UTF-8 text"))?;
                Ok(dotenv::parse(&text)?)
            }
            Err(config::files::ReadError::Missing) => Ok(Dotenv::new()),
            Err(e) => Err(anyhow::anyhow!(".env {e}")),
        }
    }

    /// `path` made absolute against the current folder.
    pub fn absolute(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_owned()
        } else {
            self.cwd.join(path)
        }
    }
}
