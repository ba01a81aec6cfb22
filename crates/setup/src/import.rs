//! `import-pi`: stages the host's pi setup into the overlay.
//!
//! Two phases. First every host file is read and judged (no link is followed, a `models.json` with a
//! credential or a host `mcp.json` that cannot be read stops the import); nothing is written unless
//! every check passed. Then each part of the overlay is replaced atomically so that it follows the
//! host: what the host has is staged, and what the host lacks is removed from the overlay.

use std::io;
use std::path::{Path, PathBuf};

use config::files::{self, ReadError};
use config::import::{self, HostFileError, McpImport};
use config::models::{self, Models, ModelsError};

use crate::fsutil::{self, Copied, Kind};

pub const MCP_FILE: &str = "mcp.json";
pub const MODELS_FILE: &str = "models.json";
pub const SKILLS_DIR: &str = "skills";
pub const APPEND_SYSTEM_FILE: &str = "APPEND_SYSTEM.md";
/// Host files that hold credentials or the host's own state: never staged, only mentioned.
pub const NEVER_STAGED: [&str; 5] = [
    "mcp-auth.json",
    "auth.json",
    "settings.json",
    "sessions",
    "trust.json",
];
const APPEND_SYSTEM_LIMIT: usize = 1024 * 1024;

#[derive(Debug, Clone)]
pub struct Options {
    pub from: PathBuf,
    pub to: PathBuf,
    pub no_mcp: bool,
}

/// Why nothing was imported. The overlay is exactly as it was.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("the host's pi folder {0} does not exist")]
    FromMissing(PathBuf),
    #[error("{0} is a link; import-pi does not follow links (give the real folder)")]
    Link(PathBuf),
    #[error("{0} is not a folder")]
    NotAFolder(PathBuf),
    #[error("the host's mcp.json cannot be read: {0}")]
    HostMcp(String),
    #[error("the host's models.json cannot be staged: {0}")]
    Models(ModelsError),
    #[error("the host's {file} cannot be read: {why}")]
    HostFile { file: &'static str, why: String },
    #[error("cannot write {what} ({kind})")]
    Write { what: String, kind: io::ErrorKind },
}

impl ImportError {
    /// Unreadable input is 2; a host file refused for what it says is 1.
    pub fn is_refusal(&self) -> bool {
        matches!(self, ImportError::Models(ModelsError::Refused(_)))
    }
}

/// What happened to the overlay's `mcp.json`.
#[derive(Debug)]
pub enum McpOutcome {
    /// `--no-mcp`: the overlay has no `mcp.json` now.
    NoMcp { removed: bool },
    /// The host has no `mcp.json`: the overlay has none now.
    NoHostFile { removed: bool },
    /// The host's servers were judged; the overlay's file was replaced, or removed when none could
    /// be staged.
    Imported { plan: McpImport, removed: bool },
}

/// What happened to a file or folder that follows the host's.
#[derive(Debug, PartialEq, Eq)]
pub enum PartOutcome<T> {
    Staged(T),
    /// The host has none; the overlay's was removed if it had one.
    NotOnHost {
        removed: bool,
    },
}

#[derive(Debug, PartialEq, Eq)]
pub struct SkillsStaged {
    /// The skills, by their top-level folder or file name.
    pub names: Vec<String>,
    pub copied: Copied,
}

#[derive(Debug)]
pub struct Report {
    pub from: PathBuf,
    pub to: PathBuf,
    pub mcp: McpOutcome,
    pub models: PartOutcome<Models>,
    pub skills: PartOutcome<SkillsStaged>,
    pub append_system: PartOutcome<()>,
    /// Host files that exist and were deliberately not staged.
    pub never_staged: Vec<&'static str>,
}

/// What the first phase decided.
struct Plan {
    mcp: Option<McpImport>,
    host_has_mcp: bool,
    models: Option<(Vec<u8>, Models)>,
    skills: bool,
    append_system: Option<Vec<u8>>,
}

pub fn import(opts: &Options) -> Result<Report, ImportError> {
    check_folder(&opts.from, true)?;
    check_folder(&opts.to, false)?;
    let plan = read_host(opts)?;

    if fsutil::kind(&opts.to).map_err(write_err("the overlay folder"))? == Kind::Missing {
        std::fs::create_dir_all(&opts.to).map_err(write_err("the overlay folder"))?;
    }
    fsutil::remove_leftovers(&opts.to).map_err(write_err("the overlay folder"))?;

    let mcp_path = opts.to.join(MCP_FILE);
    let mcp = if opts.no_mcp {
        McpOutcome::NoMcp {
            removed: remove(&mcp_path)?,
        }
    } else if !plan.host_has_mcp {
        McpOutcome::NoHostFile {
            removed: remove(&mcp_path)?,
        }
    } else {
        let plan = plan.mcp.unwrap_or_default();
        let removed = match plan.overlay_file() {
            Some(text) => {
                write(&mcp_path, text.as_bytes())?;
                false
            }
            None => remove(&mcp_path)?,
        };
        McpOutcome::Imported { plan, removed }
    };

    let models_path = opts.to.join(MODELS_FILE);
    let models = match plan.models {
        Some((bytes, models)) => {
            write(&models_path, &bytes)?;
            PartOutcome::Staged(models)
        }
        None => PartOutcome::NotOnHost {
            removed: remove(&models_path)?,
        },
    };

    let skills_path = opts.to.join(SKILLS_DIR);
    let skills = if plan.skills {
        PartOutcome::Staged(stage_skills(&opts.from.join(SKILLS_DIR), &skills_path)?)
    } else {
        PartOutcome::NotOnHost {
            removed: fsutil::remove_dir_if_present(&skills_path).map_err(write_err("skills/"))?,
        }
    };

    let append_path = opts.to.join(APPEND_SYSTEM_FILE);
    let append_system = match plan.append_system {
        Some(bytes) => {
            write(&append_path, &bytes)?;
            PartOutcome::Staged(())
        }
        None => PartOutcome::NotOnHost {
            removed: remove(&append_path)?,
        },
    };

    let never_staged = NEVER_STAGED
        .into_iter()
        .filter(|name| {
            !matches!(
                fsutil::kind(&opts.from.join(name)),
                Ok(Kind::Missing) | Err(_)
            )
        })
        .collect();
    Ok(Report {
        from: opts.from.clone(),
        to: opts.to.clone(),
        mcp,
        models,
        skills,
        append_system,
        never_staged,
    })
}

/// A folder that must be a real folder: never a link. The overlay may be missing (it is created).
fn check_folder(path: &Path, must_exist: bool) -> Result<(), ImportError> {
    match fsutil::kind(path) {
        Ok(Kind::Dir) => Ok(()),
        Ok(Kind::Link) => Err(ImportError::Link(path.to_owned())),
        Ok(Kind::Missing) if must_exist => Err(ImportError::FromMissing(path.to_owned())),
        Ok(Kind::Missing) => Ok(()),
        Ok(_) => Err(ImportError::NotAFolder(path.to_owned())),
        Err(e) => Err(ImportError::HostFile {
            file: "folder",
            why: format!("{}", e.kind()),
        }),
    }
}

/// Reads one host file: `None` when it is not there; a link or a failed read is an error.
fn read_host_file(
    from: &Path,
    name: &'static str,
    limit: usize,
) -> Result<Option<Vec<u8>>, ImportError> {
    match files::read_file(&from.join(name), limit) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(ReadError::Missing) => Ok(None),
        Err(ReadError::Link) => Err(ImportError::Link(from.join(name))),
        Err(e) => Err(ImportError::HostFile {
            file: name,
            why: e.to_string(),
        }),
    }
}

fn read_host(opts: &Options) -> Result<Plan, ImportError> {
    let mut plan = Plan {
        mcp: None,
        host_has_mcp: false,
        models: None,
        skills: false,
        append_system: None,
    };
    if !opts.no_mcp {
        let bytes = match read_host_file(&opts.from, MCP_FILE, config::mcp::MAX_FILE_BYTES) {
            Err(ImportError::Link(_)) => {
                return Err(ImportError::HostMcp(
                    "it is a link, and import-pi does not follow links".to_owned(),
                ));
            }
            other => other?,
        };
        if let Some(bytes) = bytes {
            plan.host_has_mcp = true;
            plan.mcp = Some(
                import::plan_mcp(&bytes)
                    .map_err(|e: HostFileError| ImportError::HostMcp(e.to_string()))?,
            );
        }
    }
    if let Some(bytes) = read_host_file(&opts.from, MODELS_FILE, config::mcp::MAX_FILE_BYTES)? {
        let models = models::check(&bytes).map_err(ImportError::Models)?;
        plan.models = Some((bytes, models));
    }
    plan.skills = match fsutil::kind(&opts.from.join(SKILLS_DIR)) {
        Ok(Kind::Dir) => true,
        Ok(Kind::Missing) => false,
        Ok(Kind::Link) => return Err(ImportError::Link(opts.from.join(SKILLS_DIR))),
        Ok(_) => return Err(ImportError::NotAFolder(opts.from.join(SKILLS_DIR))),
        Err(e) => {
            return Err(ImportError::HostFile {
                file: SKILLS_DIR,
                why: e.kind().to_string(),
            });
        }
    };
    plan.append_system = read_host_file(&opts.from, APPEND_SYSTEM_FILE, APPEND_SYSTEM_LIMIT)?;
    Ok(plan)
}

fn stage_skills(src: &Path, target: &Path) -> Result<SkillsStaged, ImportError> {
    let staged = fsutil::staging_path(target).map_err(write_err("skills/"))?;
    let copied = match fsutil::copy_tree(src, &staged) {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staged);
            return Err(write_err("skills/")(e));
        }
    };
    let mut names: Vec<String> = std::fs::read_dir(&staged)
        .map_err(write_err("skills/"))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    fsutil::replace_dir(&staged, target).map_err(write_err("skills/"))?;
    Ok(SkillsStaged { names, copied })
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), ImportError> {
    fsutil::write_atomic(path, bytes, 0o644).map_err(write_err_path(path))
}

fn remove(path: &Path) -> Result<bool, ImportError> {
    fsutil::remove_file_if_present(path).map_err(write_err_path(path))
}

fn write_err(what: &'static str) -> impl Fn(io::Error) -> ImportError {
    move |e| ImportError::Write {
        what: what.to_owned(),
        kind: e.kind(),
    }
}

fn write_err_path(path: &Path) -> impl Fn(io::Error) -> ImportError + '_ {
    move |e| ImportError::Write {
        what: path.display().to_string(),
        kind: e.kind(),
    }
}
