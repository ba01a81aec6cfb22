//! What every command may read of the process: the current folder, the environment, and the
//! deployment folder's `.env` (read once, and only when a command asks for a setting the
//! environment does not give).

use std::cell::OnceCell;
use std::path::{Path, PathBuf};

use config::dotenv::{self, Dotenv};
use config::settings::{self, SettingError, Settings};

/// The variable that names the deployment folder when `--dir` does not.
pub const DIR_VARIABLE: &str = "PI_DIR";

pub struct Context {
    pub cwd: PathBuf,
    /// The deployment folder: `--dir`, else `PI_DIR`, else the current folder.
    pub dir: PathBuf,
    env: fn(&str) -> Option<String>,
    dotenv: OnceCell<Result<Dotenv, String>>,
    /// `--log-format` as given (`text` or `json`), for a program the command starts itself.
    pub log_format: &'static str,
}

/// Why settings could not be resolved: the `.env` itself, or the values in it.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{0}")]
    Dotenv(String),
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Values(Vec<SettingError>),
}

impl Context {
    pub fn new(dir: Option<&Path>) -> anyhow::Result<Context> {
        let cwd = std::env::current_dir()
            .map_err(|e| anyhow::anyhow!("cannot read the current folder ({})", e.kind()))?;
        let dir = match dir {
            Some(d) if d.is_absolute() => d.to_owned(),
            Some(d) => cwd.join(d),
            None => cwd.clone(),
        };
        Ok(Context {
            cwd,
            dir,
            env: |name| std::env::var(name).ok(),
            dotenv: OnceCell::new(),
            log_format: "text",
        })
    }

    /// For a command that reads a deployment: an error naming the folder when it is none (it has
    /// neither a `.env` nor a `state/`), rather than an empty answer from a folder that was never
    /// one.
    pub fn deployment(&self) -> anyhow::Result<()> {
        if self.dir.join(".env").exists() || self.dir.join("state").is_dir() {
            return Ok(());
        }
        anyhow::bail!(
            "{} is not a pi-dispatch deployment (it has no .env and no state/): run `pi-dispatch init` there, or name the deployment with --dir DIR (or {DIR_VARIABLE})",
            self.dir.display()
        )
    }

    /// A variable of the process environment, empty counting as unset.
    pub fn env(&self, name: &str) -> Option<String> {
        (self.env)(name).filter(|v| !v.is_empty())
    }

    /// A setting's value: the environment's, else the `.env`'s. The `.env` is read only when the
    /// environment does not decide, so a broken `.env` does not stop a command that never needs it.
    pub fn setting(&self, name: &str) -> Result<Option<String>, SettingsError> {
        if let Some(v) = self.env(name) {
            return Ok(Some(v));
        }
        Ok(settings::lookup(name, None, self.dotenv()?))
    }

    /// Every setting, resolved and checked.
    pub fn settings(&self) -> Result<Settings, SettingsError> {
        let dotenv = self.dotenv()?;
        let get = |name: &str| settings::lookup(name, self.env(name), dotenv);
        settings::resolve(&get, &self.dir).map_err(SettingsError::Values)
    }

    /// The `.env` of the deployment folder; empty when there is none.
    pub fn dotenv(&self) -> Result<&Dotenv, SettingsError> {
        self.dotenv
            .get_or_init(|| read_dotenv(&self.dir.join(".env")))
            .as_ref()
            .map_err(|e| SettingsError::Dotenv(e.clone()))
    }

    /// The deployment's environment (the process's over the `.env`), as the worker reads keys and
    /// forwarded variables from it.
    pub fn environment(&self) -> Result<pickup::fs::Environment, SettingsError> {
        Ok(pickup::fs::Environment::new(self.dotenv()?.clone()))
    }

    /// The deployment's queue (`PI_QUEUE`), signed in to with `PI_QUEUE_PASSWORD` from the
    /// deployment's environment when it is a Redis.
    pub fn queue(&self, settings: &Settings) -> anyhow::Result<std::sync::Arc<dyn queue::Queue>> {
        let password = match settings.queue {
            settings::QueueBackend::Redis { .. } => {
                self.environment()?.get(settings::QUEUE_PASSWORD_SETTING)
            }
            settings::QueueBackend::Sqlite => None,
        };
        Ok(queue::open(settings, password)?)
    }

    /// The overlay folder: `flag` when given (relative to the current folder), else the
    /// `PI_GLOBAL_PI_DIR` setting, else `pi-global` in the deployment folder.
    pub fn overlay_dir(&self, flag: Option<&Path>) -> anyhow::Result<PathBuf> {
        Ok(match flag {
            Some(dir) => self.absolute(dir),
            None => settings::overlay_dir(self.setting(settings::OVERLAY_SETTING)?, &self.dir)?,
        })
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

fn read_dotenv(path: &Path) -> Result<Dotenv, String> {
    match config::files::read_file(path, 1024 * 1024) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes).map_err(|_| ".env is not UTF-8 text".to_owned())?;
            dotenv::parse(&text).map_err(|e| e.to_string())
        }
        Err(config::files::ReadError::Missing) => Ok(Dotenv::new()),
        Err(e) => Err(format!(".env {e}")),
    }
}
