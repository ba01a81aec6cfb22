pub mod doctor;
pub mod explain;
pub mod import_pi;
pub mod init;
pub mod job;
pub mod mcp_check;
pub mod triggers_check;
