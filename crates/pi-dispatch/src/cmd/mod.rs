pub mod mcp_check;
