//! Deployment settings: the process environment over the deployment's `.env`.
//!
//! Only what the commands built so far need lives here; each setting is resolved by one function, so
//! every command reads it the same way.

use std::path::{Path, PathBuf};

use crate::dotenv::Dotenv;

/// Where the overlay folder is when neither `--overlay` nor `PI_GLOBAL_PI_DIR` says.
pub const DEFAULT_OVERLAY_DIR: &str = "pi-global";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("{name} must be an absolute path")]
    NotAbsolute { name: &'static str },
}

/// Looks a setting up: a non-empty value in the process environment wins, then the `.env`.
/// An empty value counts as unset.
pub fn lookup<'a>(
    name: &str,
    env: &'a dyn Fn(&str) -> Option<String>,
    dotenv: &'a Dotenv,
) -> Option<String> {
    env(name)
        .filter(|v| !v.is_empty())
        .or_else(|| dotenv.get(name).filter(|v| !v.is_empty()).cloned())
}

/// The overlay folder: `PI_GLOBAL_PI_DIR` (which must be absolute), else `./pi-global` under `cwd`.
pub fn overlay_dir(
    env: &dyn Fn(&str) -> Option<String>,
    dotenv: &Dotenv,
    cwd: &Path,
) -> Result<PathBuf, SettingError> {
    const NAME: &str = "PI_GLOBAL_PI_DIR";
    match lookup(NAME, env, dotenv) {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                Ok(dir)
            } else {
                Err(SettingError::NotAbsolute { name: NAME })
            }
        }
        None => Ok(cwd.join(DEFAULT_OVERLAY_DIR)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn environment_wins_over_dotenv_and_default_is_pi_global() {
        let dotenv: Dotenv = [("PI_GLOBAL_PI_DIR".to_owned(), "/from/dotenv".to_owned())].into();
        let cwd = Path::new("/work");
        let env = env_of(&[("PI_GLOBAL_PI_DIR", "/from/env")]);
        assert_eq!(
            overlay_dir(&env, &dotenv, cwd),
            Ok(PathBuf::from("/from/env"))
        );
        let empty = env_of(&[("PI_GLOBAL_PI_DIR", "")]);
        assert_eq!(
            overlay_dir(&empty, &dotenv, cwd),
            Ok(PathBuf::from("/from/dotenv"))
        );
        let none = env_of(&[]);
        assert_eq!(
            overlay_dir(&none, &Dotenv::new(), cwd),
            Ok(PathBuf::from("/work/pi-global"))
        );
    }

    #[test]
    fn a_relative_overlay_setting_is_refused_by_name() {
        let env = env_of(&[("PI_GLOBAL_PI_DIR", "relative/canary")]);
        let err = overlay_dir(&env, &Dotenv::new(), Path::new("/")).unwrap_err();
        assert_eq!(err.to_string(), "PI_GLOBAL_PI_DIR must be an absolute path");
    }
}
