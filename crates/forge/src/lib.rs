//! The worker's side of a forge job: the job's token ([`api::Forges::mint`]), the clone and the
//! push ([`git`]), the comment ([`api::Forges::comment_once`]) and the pull request
//! ([`api::Forges::open_change_request`]). See `docs/forges.md`.
//!
//! On the job's path: around the sandbox: the job's token and clone before it, its comment, push
//! and pull request after it.

pub mod api;
pub mod git;
pub mod inert;
pub mod scan;
pub mod token;
pub mod tree;

pub use api::{ForgeError, Forges, GithubApp, GitlabDeployment, Posted, Scope};
pub use token::{AppKey, Secret};
