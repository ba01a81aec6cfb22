//! What the egress proxy refused a job, as it tells the worker over its control socket and as the
//! job's record keeps it: one type on both sides. And, for egress off, where slirp4netns is.

use serde::{Deserialize, Serialize};

/// Where Debian installs slirp4netns, which carries a job's own network to the outside when
/// egress is off (the worker starts it; doctor looks for it).
pub const SLIRP4NETNS: &str = "/usr/bin/slirp4netns";

/// The reason of the entry that counts a job's denials of hosts past the ones its list keeps
/// (host `*`, port 0).
pub const LEFT_OUT: &str = "more-hosts-left-out";

/// Every reason an entry of the list may have: the proxy's refusals, and [`LEFT_OUT`].
pub const REASONS: [&str; 8] = [
    "not-allowed",
    "plain-http-443",
    "loopback",
    "own-machine",
    "special-address",
    "unresolved",
    "rules-unreadable",
    LEFT_OUT,
];

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
