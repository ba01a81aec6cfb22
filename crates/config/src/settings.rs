//! Deployment settings: the process environment over the deployment's `.env`.
//!
//! Only what the commands built so far need lives here; each setting is resolved by one function, so
//! every command reads it the same way.

use std::path::{Path, PathBuf};

use crate::dotenv::Dotenv;

/// Where the overlay folder is when neither `--overlay` nor `PI_GLOBAL_PI_DIR` says.
pub const DEFAULT_OVERLAY_DIR: &str = "pi-global";

/// The setting that names the overlay folder.
pub const OVERLAY_SETTING: &str = "PI_GLOBAL_PI_DIR";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("{name} must be an absolute path")]
    NotAbsolute { name: &'static str },
}

/// The value of a setting: a non-empty value in the process environment wins, then the `.env`.
/// An empty value counts as unset.
pub fn lookup(name: &str, env: Option<String>, dotenv: &Dotenv) -> Option<String> {
    env.filter(|v| !v.is_empty())
        .or_else(|| dotenv.get(name).filter(|v| !v.is_empty()).cloned())
}

/// The overlay folder from the value of `PI_GLOBAL_PI_DIR` (which must be absolute), else
/// `./pi-global` under `cwd`.
pub fn overlay_dir(value: Option<String>, cwd: &Path) -> Result<PathBuf, SettingError> {
    match value {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                Ok(dir)
            } else {
                Err(SettingError::NotAbsolute {
                    name: OVERLAY_SETTING,
                })
            }
        }
        None => Ok(cwd.join(DEFAULT_OVERLAY_DIR)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_wins_over_dotenv_and_empty_counts_as_unset() {
        let dotenv: Dotenv = [("A".to_owned(), "dotenv".to_owned())].into();
        assert_eq!(lookup("A", Some("env".into()), &dotenv), Some("env".into()));
        assert_eq!(
            lookup("A", Some(String::new()), &dotenv),
            Some("dotenv".into())
        );
        assert_eq!(lookup("A", None, &dotenv), Some("dotenv".into()));
        let empty: Dotenv = [("A".to_owned(), String::new())].into();
        assert_eq!(lookup("A", None, &empty), None);
    }

    #[test]
    fn the_overlay_defaults_to_pi_global_and_must_be_absolute() {
        let cwd = Path::new("/work");
        assert_eq!(
            overlay_dir(Some("/srv/o".into()), cwd),
            Ok(PathBuf::from("/srv/o"))
        );
        assert_eq!(overlay_dir(None, cwd), Ok(PathBuf::from("/work/pi-global")));
        let err = overlay_dir(Some("relative/canary".into()), cwd).unwrap_err();
        assert_eq!(err.to_string(), "PI_GLOBAL_PI_DIR must be an absolute path");
    }
}
