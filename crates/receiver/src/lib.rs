//! The receiver: GitHub and GitLab webhooks in, jobs on the queue out. It checks each delivery
//! (the signature or token, over the raw body), reads the few fields the triggers need
//! ([`github`], [`gitlab`]), matches it against `triggers.json` with the worker's own loader
//! ([`matching`]), and queues one job per matching trigger, remembering the delivery in the same
//! step, so a delivery sent again queues nothing. It never runs a job. See `docs/receiver.md`.
//!
//! On the job's path: a forge's event becomes a queued job.

pub mod github;
pub mod gitlab;
pub mod matching;
pub mod payload;
pub mod server;
pub mod signature;

/// The webhook secret of the GitHub App (or the repository's webhook).
pub const GITHUB_SECRET_SETTING: &str = "PI_GITHUB_WEBHOOK_SECRET";
/// The secret token of the GitLab webhook.
pub const GITLAB_TOKEN_SETTING: &str = "PI_GITLAB_WEBHOOK_TOKEN";
/// Where the receiver listens (an address and port; loopback by default, behind a TLS proxy).
pub const LISTEN_SETTING: &str = "PI_RECEIVER_LISTEN";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8780";
