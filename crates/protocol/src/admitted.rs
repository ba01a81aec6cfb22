//! An admitted job: everything it will run with, as the admission decided it. After admission the
//! worker only carries this out (resolve the named secrets, write `/job`, start the sandbox) and
//! never reads the job as queued again, so what `explain`, `doctor` and `run` report is what the
//! worker does.

use std::path::PathBuf;

use serde::Serialize;

use crate::forge_event::ForgeEvent;
use crate::job_mcp::JobMcpFile;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Admitted {
    /// The job's id.
    #[serde(skip)]
    pub job_id: String,
    /// Where it runs and which forge it answers.
    #[serde(skip)]
    pub kind: crate::job::Kind,
    /// What queued it: `cron`, `cli`, or the forge event's type.
    #[serde(skip)]
    pub trigger_type: String,
    /// What the agent is asked to do.
    #[serde(skip)]
    pub work: Work,
    /// `run.flow` as the trigger names it (a forge job's is also in its [`ForgeTarget`]): the
    /// job's `event.json` tells it to the agent.
    #[serde(skip)]
    pub flow: Option<String>,
    /// The job image's name (`images/NAME/` on the embedded backend).
    pub image: String,
    /// Where that image is on this host (`images/NAME/` of the deployment).
    #[serde(skip)]
    pub image_dir: PathBuf,
    /// The job's own folder on the host (`state/jobs/ID`): its `/job`, its transcript, a forge
    /// job's clone.
    #[serde(skip)]
    pub state_dir: PathBuf,
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
    /// `run.models` and `run.maxCostUsd`: what the runner's model gateway holds every call to.
    #[serde(skip)]
    pub model_rules: ModelRules,
    /// `run.excludeTools`: the tools the hub neither lists nor lets the agent call.
    #[serde(skip)]
    pub exclude_tools: Vec<String>,
    pub egress: Egress,
    /// `run.pins`: what the hub does with a server's tools that no longer match their pin.
    #[serde(skip_serializing_if = "crate::pins::PinPolicy::is_default")]
    pub pins: crate::pins::PinPolicy,
}

impl Admitted {
    /// What the runner is told about the job beside its `mcp.json` (`/job/runner.json`).
    pub fn runner_input(&self) -> crate::job_dir::RunnerInput {
        crate::job_dir::RunnerInput {
            mcp_digest: self.mcp.as_ref().map(|f| f.digest.clone()),
            exclude_tools: self.exclude_tools.clone(),
            codemode_models: self.codemode_models,
            models: self.model_rules.models.clone(),
            max_cost_usd: self.model_rules.max_cost_usd,
            loopback: match &self.egress {
                Egress::On { loopback, .. } => loopback.clone(),
                Egress::Off => Vec::new(),
            },
            // The worker adds the servers' pins, read from the queue's store.
            pins: std::collections::BTreeMap::new(),
            pin_policy: self.pins,
            list_only: false,
        }
    }
}

/// What the agent is asked to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Work {
    /// A local job: its task is the prompt.
    Task(String),
    /// A forge job: its prompt is made from the event once its clone names the base branch.
    Forge(Box<ForgeTarget>),
}

impl Work {
    pub fn forge(&self) -> Option<&ForgeTarget> {
        match self {
            Work::Forge(t) => Some(t),
            Work::Task(_) => None,
        }
    }
}

/// A forge job's issue or pull request, and what to do about it.
#[derive(Debug, Clone, PartialEq)]
pub struct ForgeTarget {
    pub event: ForgeEvent,
    pub flow: Flow,
    /// For a gitlab job, glab's `GITLAB_HOST`: the host (and port) of `GITLAB_URL`.
    pub gitlab_host: Option<String>,
}

/// What a forge job does with the agent's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// The agent's final message is posted on the issue.
    Answer,
    /// Its changes are pushed to a branch of their own and proposed.
    Fix,
}

impl Flow {
    pub fn parse(flow: &str) -> Option<Flow> {
        match flow {
            "answer" => Some(Flow::Answer),
            "fix" => Some(Flow::Fix),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Flow::Answer => "answer",
            Flow::Fix => "fix",
        }
    }
}

/// The limits the runner's model gateway applies to every model call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelRules {
    /// `run.models`: the only models the job may call.
    pub models: Option<Vec<String>>,
    /// `run.maxCostUsd`: the most the job may spend.
    pub max_cost_usd: Option<f64>,
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
    On {
        routes: Vec<Route>,
        /// The routes to hosts on the worker's own machine (`host:port`, each once): the runner
        /// serves them on the job's loopback.
        #[serde(skip)]
        loopback: Vec<String>,
    },
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
