//! What the egress proxy refused a job, as it tells the worker over its control socket and as the
//! job's record keeps it: one type on both sides.

use serde::{Deserialize, Serialize};

/// A host and port the egress proxy refused the job, how many times, and why (the proxy's code of
/// the first refusal: `not-allowed`, `loopback`, `special-address`, ...). Never a path or query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Denied {
    pub host: String,
    pub port: u16,
    pub reason: String,
    pub count: u64,
}
