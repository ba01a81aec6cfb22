//! The operator's setup commands as library functions: `init`, `import-pi` and `doctor`. Decisions
//! come from the pure `config` crate; this crate carries them out on the file system.
//!
//! On the job's path: before it: the deployment the worker reads, made and checked.

pub mod doctor;
pub mod forge_mcp;
pub mod fsutil;
pub mod image;
pub mod import;
pub mod init;
