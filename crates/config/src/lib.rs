//! pi-dispatch's configuration, read strictly and validated into typed values.
//!
//! Everything here is pure: functions take the text of a file (or the values of settings) and return
//! validated values or problems. Nothing is repaired: what is not exactly right is refused, and every
//! message names the field, never the value written there.
//!
//! On the job's path: before it: what the operator wrote (settings, triggers, the overlay, egress
//! files), read for the admission, the worker and doctor.

pub mod catalog;
pub mod dotenv;
pub mod egress;
pub mod endpoints;
pub mod files;
pub mod import;
/// The strict JSON reader: protocol's (a key written twice is refused), for every config file.
pub use protocol::json;
pub mod mcp;
pub mod model_rules;
pub mod models;
pub mod prices;
pub mod problem;
pub mod providers;
pub mod reference;
pub mod settings;
pub mod tools;
pub mod triggers;
pub mod url;
pub mod wire_format;
pub mod worst_case;

#[cfg(test)]
mod mcp_tests;
