//! An admitted job: everything it will run with, as the admission decided it. After admission the
//! worker only carries this out (resolve the named secrets, write `/job`, start the sandbox), so
//! what `explain`, `doctor` and `run` report is what the worker does.

use serde::Serialize;

use crate::job_mcp::JobMcpFile;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Admitted {
    /// The job image's name (`images/NAME/` on the embedded backend).
    pub image: String,
    pub workspace: Workspace,
    /// The MCP servers it connects, in the order named.
    pub servers: Vec<String>,
    /// Its `/job/mcp.json`, when it names servers.
    #[serde(skip)]
    pub mcp: Option<JobMcpFile>,
    /// Whether a codemode script's `models` are on: the overlay's `codemodeModels`, for every job
    /// (whatever servers it names, none included).
    pub codemode_models: bool,
    /// The `run.secrets` to resolve on the host: each variable with its reference (a reference
    /// names where a secret is, not the secret).
    pub secrets: Vec<SecretRef>,
    /// The secrets profile whose resolver fills them.
    pub secrets_profile: Option<String>,
    pub model: ModelChoice,
    pub egress: Egress,
}

/// The folder the job works in, and the host user it runs as (its owner).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Workspace {
    pub path: String,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    pub name: String,
    pub reference: String,
}

/// The job's model and where its key comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelChoice {
    pub provider: String,
    pub model: String,
    /// The worker's variable that holds the provider's key (by name); `None` for a keyless
    /// provider (a declared endpoint marked keyless).
    pub key_variable: Option<String>,
    /// Where pi knows the model from: `builtin` (its catalog) or `overlay` (models.json).
    pub source: &'static str,
}

/// What the job may reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "policy")]
pub enum Egress {
    /// `PI_EGRESS=0`: the host's network.
    Off,
    /// Only through the egress proxy: these routes of the job's own servers (besides the
    /// allowlist and the declared endpoints every job may reach).
    On { routes: Vec<Route> },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// What needs the route: a server's name, `forge`, or `model`.
    #[serde(rename = "for")]
    pub for_: String,
    pub host: String,
    pub port: u16,
}
