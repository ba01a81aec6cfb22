//! `import-pi`: stages the host's pi setup into the overlay.
//!
//! Three phases, so that a failure never leaves a mix of old and new:
//! 1. read and judge every host file (no link followed; a `models.json` with a credential, or a host
//!    `mcp.json` that cannot be read, stops here);
//! 2. stage: write every new file and the new `skills/` under temporary names beside their targets,
//!    under an exclusive lock of the overlay. A failure here discards the staging: nothing changed;
//! 3. commit: rename each staged part into place (each one atomic; `skills/` swapped in one step).
//!
//! The overlay's `mcp.json` follows the host's: replaced on every import, removed when nothing can be
//! staged. `models.json`, `skills/` and `APPEND_SYSTEM.md` are staged when the host has them and left
//! alone when it has not.

use std::io;
use std::path::{Path, PathBuf};

use config::files::{self, ReadError};
use config::import::{self, McpImport};
use config::models::{self, Models, ModelsError};

use crate::fsutil::{self, Copied, FolderLock, Kind, StagedFile};

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

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("the host's pi folder {0} does not exist")]
    FromMissing(PathBuf),
    #[error("{0} is a link; import-pi does not follow links (give the real folder)")]
    Link(PathBuf),
    #[error("{0} is not a folder")]
    NotAFolder(PathBuf),
    #[error(
        "the overlay and the host's pi folder are the same folder, or one holds the other; the overlay must be a folder of its own"
    )]
    SameFolder,
    #[error("the host's mcp.json cannot be read: {0}")]
    HostMcp(String),
    #[error("the host's models.json cannot be staged: {0}")]
    Models(ModelsError),
    #[error("the host's {file} cannot be read: {why}")]
    HostFile { file: String, why: String },
    #[error("another import into this overlay is running")]
    Busy,
    #[error("cannot stage {what} in the overlay ({why})")]
    Stage { what: String, why: String },
    #[error(
        "cannot put {what} in place ({kind}); the overlay may be partly updated: run import-pi again"
    )]
    Commit { what: String, kind: io::ErrorKind },
}

impl ImportError {
    /// Unreadable input is exit 2; a host file refused for what it holds is exit 1.
    pub fn is_refusal(&self) -> bool {
        matches!(self, ImportError::Models(ModelsError::Refused(_)))
    }

    /// Whether the overlay is exactly as it was: true for every failure before the commit phase.
    pub fn changed_nothing(&self) -> bool {
        !matches!(self, ImportError::Commit { .. })
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

/// What happened to a part that is staged only when the host has it.
#[derive(Debug, PartialEq, Eq)]
pub enum PartOutcome<T> {
    Staged(T),
    /// The host has none; the overlay's, if any, is left as it is.
    NotOnHost,
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
    /// What the overlay's replaced files held that the new ones do not.
    pub dropped: Dropped,
}

/// What an import took out of the overlay: names only. The overlay's `mcp.json` and `models.json`
/// are replaced whole, so a server or provider written there by hand is gone after the import.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Servers of the overlay's previous `mcp.json` that its new one (or none) does not have.
    pub servers: Vec<String>,
    /// Providers of the overlay's previous `models.json` that the host's does not have.
    pub providers: Vec<String>,
    /// Overlay files replaced or removed that could not be read before, so what they held is not
    /// known (`mcp.json`, `models.json`).
    pub unread: Vec<&'static str>,
}

/// Phase 1's result: what the host has, judged.
struct HostSetup {
    /// `None` with `--no-mcp` or when the host has no `mcp.json`.
    mcp: Option<McpImport>,
    host_has_mcp: bool,
    models: Option<(Vec<u8>, Models)>,
    skills: bool,
    append_system: Option<Vec<u8>>,
}

/// Phase 2's result: every new part written under a temporary name.
struct Staging {
    mcp: Option<StagedFile>,
    models: Option<StagedFile>,
    append_system: Option<StagedFile>,
    skills: Option<(PathBuf, SkillsStaged)>,
}

impl Staging {
    fn discard(self) {
        for f in [self.mcp, self.models, self.append_system]
            .into_iter()
            .flatten()
        {
            f.discard();
        }
        if let Some((dir, _)) = self.skills {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

pub fn import(opts: &Options) -> Result<Report, ImportError> {
    check_folders(opts)?;
    let host = read_host(opts)?;
    let _lock = lock_overlay(&opts.to)?;
    let dropped = dropped(opts, &host);

    let staging = stage(opts, &host)?;
    let (mcp_file, models_file, append_file, skills) = (
        staging.mcp,
        staging.models,
        staging.append_system,
        staging.skills,
    );

    // Commit: from here on, each step is atomic on its own.
    let mcp = commit_mcp(opts, host.host_has_mcp, host.mcp, mcp_file)?;
    let models = match (models_file, host.models) {
        (Some(f), Some((_, models))) => {
            f.commit().map_err(commit_err(MODELS_FILE))?;
            PartOutcome::Staged(models)
        }
        _ => PartOutcome::NotOnHost,
    };
    let skills = match skills {
        Some((dir, staged)) => {
            fsutil::replace_dir(&dir, &opts.to.join(SKILLS_DIR)).map_err(commit_err("skills/"))?;
            PartOutcome::Staged(staged)
        }
        None => PartOutcome::NotOnHost,
    };
    let append_system = match append_file {
        Some(f) => {
            f.commit().map_err(commit_err(APPEND_SYSTEM_FILE))?;
            PartOutcome::Staged(())
        }
        None => PartOutcome::NotOnHost,
    };
    Ok(Report {
        from: opts.from.clone(),
        to: opts.to.clone(),
        mcp,
        models,
        skills,
        append_system,
        never_staged: never_staged(&opts.from),
        dropped,
    })
}

/// Makes the overlay folder if it is missing, takes its lock, and cleans what an interrupted
/// import left.
fn lock_overlay(to: &Path) -> Result<FolderLock, ImportError> {
    if fsutil::kind(to).map_err(stage_err("the overlay folder"))? == Kind::Missing {
        std::fs::create_dir_all(to).map_err(stage_err("the overlay folder"))?;
    }
    let lock = FolderLock::take(to).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock => ImportError::Busy,
        _ => stage_err("the overlay's lock")(e),
    })?;
    fsutil::remove_leftovers(to).map_err(stage_err("the overlay folder"))?;
    Ok(lock)
}

/// Puts the staged `mcp.json` in place, or removes the overlay's when there is none to import.
fn commit_mcp(
    opts: &Options,
    host_has_mcp: bool,
    plan: Option<McpImport>,
    mcp_file: Option<StagedFile>,
) -> Result<McpOutcome, ImportError> {
    let mcp_path = opts.to.join(MCP_FILE);
    Ok(if opts.no_mcp {
        McpOutcome::NoMcp {
            removed: remove(&mcp_path)?,
        }
    } else if !host_has_mcp {
        McpOutcome::NoHostFile {
            removed: remove(&mcp_path)?,
        }
    } else {
        let removed = match mcp_file {
            Some(f) => {
                f.commit().map_err(commit_err(MCP_FILE))?;
                false
            }
            None => remove(&mcp_path)?,
        };
        McpOutcome::Imported {
            plan: plan.unwrap_or_default(),
            removed,
        }
    })
}

/// The host's files import-pi never stages, among those it has.
fn never_staged(from: &Path) -> Vec<&'static str> {
    NEVER_STAGED
        .into_iter()
        .filter(|name| !matches!(fsutil::kind(&from.join(name)), Ok(Kind::Missing) | Err(_)))
        .collect()
}

/// What the overlay's `mcp.json` and `models.json` hold that the import will not put back: read
/// under the lock, before anything is replaced.
fn dropped(opts: &Options, host: &HostSetup) -> Dropped {
    let mut out = Dropped::default();
    // mcp.json is replaced or removed on every import: what stays is what is staged.
    let staged: Vec<&str> = host
        .mcp
        .iter()
        .flat_map(|plan| plan.staged.iter().map(|s| s.name.as_str()))
        .collect();
    if let Some(names) = old_names(opts, MCP_FILE, "mcpServers", &staged, &mut out.unread) {
        out.servers = names;
    }
    // models.json is replaced only when the host has one.
    if let Some((_, models)) = &host.models {
        let kept: Vec<&str> = models.providers.iter().map(String::as_str).collect();
        if let Some(names) = old_names(opts, MODELS_FILE, "providers", &kept, &mut out.unread) {
            out.providers = names;
        }
    }
    out
}

/// The names the overlay's `file` holds under `member` beyond `kept`; nothing when it has no such
/// file, and the file noted in `unread` when it cannot be read or parsed.
fn old_names(
    opts: &Options,
    file: &'static str,
    member: &str,
    kept: &[&str],
    unread: &mut Vec<&'static str>,
) -> Option<Vec<String>> {
    let names = match files::read_file(&opts.to.join(file), config::mcp::MAX_FILE_BYTES) {
        Ok(bytes) => import::dropped_names(&bytes, member, kept),
        Err(ReadError::Missing) => return None,
        Err(_) => None,
    };
    if names.is_none() {
        unread.push(file);
    }
    names
}

/// The host folder must be a real folder; the overlay a real folder or missing; and neither may be
/// the other or hold the other (an import would then rewrite the host's own files).
fn check_folders(opts: &Options) -> Result<(), ImportError> {
    check_folder(&opts.from, true)?;
    check_folder(&opts.to, false)?;
    let from = opts
        .from
        .canonicalize()
        .map_err(|e| ImportError::HostFile {
            file: "folder".to_owned(),
            why: e.kind().to_string(),
        })?;
    let to = canonical_even_if_missing(&opts.to);
    if to.starts_with(&from) || from.starts_with(&to) {
        return Err(ImportError::SameFolder);
    }
    Ok(())
}

/// `path` with links resolved, as far as it exists (a missing overlay is resolved through its
/// nearest existing parent).
fn canonical_even_if_missing(path: &Path) -> PathBuf {
    let mut missing = Vec::new();
    let mut at = path.to_path_buf();
    loop {
        if let Ok(real) = at.canonicalize() {
            return missing.iter().rev().fold(real, |p, name| p.join(name));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name.to_owned());
                at = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

fn check_folder(path: &Path, must_exist: bool) -> Result<(), ImportError> {
    match fsutil::kind(path) {
        Ok(Kind::Dir) => Ok(()),
        Ok(Kind::Link) => Err(ImportError::Link(path.to_owned())),
        Ok(Kind::Missing) if must_exist => Err(ImportError::FromMissing(path.to_owned())),
        Ok(Kind::Missing) => Ok(()),
        Ok(_) => Err(ImportError::NotAFolder(path.to_owned())),
        Err(e) => Err(ImportError::HostFile {
            file: path.display().to_string(),
            why: e.kind().to_string(),
        }),
    }
}

/// Reads one host file: `None` when it is not there; a link or a failed read is an error.
fn read_host_file(from: &Path, name: &str, limit: usize) -> Result<Option<Vec<u8>>, ImportError> {
    match files::read_file(&from.join(name), limit) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(ReadError::Missing) => Ok(None),
        Err(ReadError::Link) => Err(ImportError::Link(from.join(name))),
        Err(e) => Err(ImportError::HostFile {
            file: name.to_owned(),
            why: e.to_string(),
        }),
    }
}

fn read_host(opts: &Options) -> Result<HostSetup, ImportError> {
    let mut host = HostSetup {
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
            host.host_has_mcp = true;
            host.mcp =
                Some(import::plan_mcp(&bytes).map_err(|e| ImportError::HostMcp(e.to_string()))?);
        }
    }
    if let Some(bytes) = read_host_file(&opts.from, MODELS_FILE, config::mcp::MAX_FILE_BYTES)? {
        let models = models::check(&bytes).map_err(ImportError::Models)?;
        host.models = Some((bytes, models));
    }
    host.skills = match fsutil::kind(&opts.from.join(SKILLS_DIR)) {
        Ok(Kind::Dir) => true,
        Ok(Kind::Missing) => false,
        Ok(Kind::Link) => return Err(ImportError::Link(opts.from.join(SKILLS_DIR))),
        Ok(_) => return Err(ImportError::NotAFolder(opts.from.join(SKILLS_DIR))),
        Err(e) => {
            return Err(ImportError::HostFile {
                file: "skills/".to_owned(),
                why: e.kind().to_string(),
            });
        }
    };
    host.append_system = read_host_file(&opts.from, APPEND_SYSTEM_FILE, APPEND_SYSTEM_LIMIT)?;
    Ok(host)
}

/// Writes every new part under a temporary name; on any failure, removes what it wrote.
fn stage(opts: &Options, host: &HostSetup) -> Result<Staging, ImportError> {
    let mut staging = Staging {
        mcp: None,
        models: None,
        append_system: None,
        skills: None,
    };
    let result = (|| {
        if let Some(text) = host.mcp.as_ref().and_then(McpImport::overlay_file) {
            staging.mcp = Some(stage_file(&opts.to.join(MCP_FILE), text.as_bytes())?);
        }
        if let Some((bytes, _)) = &host.models {
            staging.models = Some(stage_file(&opts.to.join(MODELS_FILE), bytes)?);
        }
        if let Some(bytes) = &host.append_system {
            staging.append_system = Some(stage_file(&opts.to.join(APPEND_SYSTEM_FILE), bytes)?);
        }
        if host.skills {
            let target = opts.to.join(SKILLS_DIR);
            if !matches!(
                fsutil::kind(&target).map_err(stage_err("skills/"))?,
                Kind::Dir | Kind::Missing
            ) {
                return Err(ImportError::Stage {
                    what: "skills/".to_owned(),
                    why: "the overlay's skills is not a folder (a link or a file)".to_owned(),
                });
            }
            let dir = fsutil::staging_path(&target).map_err(stage_err("skills/"))?;
            // Set before copying, so that a failed copy is removed with the rest.
            staging.skills = Some((
                dir.clone(),
                SkillsStaged {
                    names: Vec::new(),
                    copied: Copied::default(),
                },
            ));
            let copied = fsutil::copy_tree(&opts.from.join(SKILLS_DIR), &dir).map_err(|e| {
                ImportError::HostFile {
                    file: "skills/".to_owned(),
                    why: e.to_string(),
                }
            })?;
            let mut names: Vec<String> = std::fs::read_dir(&dir)
                .map_err(stage_err("skills/"))?
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            staging.skills = Some((dir, SkillsStaged { names, copied }));
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(staging),
        Err(e) => {
            staging.discard();
            Err(e)
        }
    }
}

fn stage_file(target: &Path, bytes: &[u8]) -> Result<StagedFile, ImportError> {
    StagedFile::write(target, bytes, 0o644).map_err(|e| ImportError::Stage {
        what: target.display().to_string(),
        why: e.kind().to_string(),
    })
}

fn remove(path: &Path) -> Result<bool, ImportError> {
    fsutil::remove_file_if_present(path).map_err(commit_err(MCP_FILE))
}

fn stage_err(what: &'static str) -> impl Fn(io::Error) -> ImportError {
    move |e| ImportError::Stage {
        what: what.to_owned(),
        why: e.kind().to_string(),
    }
}

fn commit_err(what: &'static str) -> impl Fn(io::Error) -> ImportError {
    move |e| ImportError::Commit {
        what: what.to_owned(),
        kind: e.kind(),
    }
}
