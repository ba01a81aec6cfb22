pub mod init;
pub mod mcp_check;
