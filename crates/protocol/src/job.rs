//! The queued job: what a trigger (or the CLI) asks for, normalized, with the trigger's identity.
//! One type for cron, the CLI and the receiver; it is what the queue stores.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::forge_event::ForgeEvent;

/// `run.mcp` as a queued job carries it: a list of names, or anything else a writer put there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum McpField {
    Names(Vec<String>),
    Malformed(serde_json::Value),
}

impl McpField {
    pub fn names<'a>(names: impl IntoIterator<Item = &'a str>) -> McpField {
        McpField::Names(names.into_iter().map(str::to_owned).collect())
    }

    /// The names, when the field is a list of strings.
    pub fn as_names(&self) -> Option<&[String]> {
        match self {
            McpField::Names(n) => Some(n),
            McpField::Malformed(_) => None,
        }
    }
}

/// A job as queued. Lists are kept as written into the queue (strings), so that a job written by
/// another version or by hand is judged at pickup rather than trusted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Job {
    pub id: String,
    /// The index of the trigger in triggers.json when it was queued (`None` for a CLI job).
    pub trigger_index: Option<usize>,
    /// `cron`, `label`, `comment`, `pull_request`, `issue`, or `cli`.
    pub trigger_type: String,
    /// `local`, `github`, `gitlab`, `forgejo`, `azure`.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub flow: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub command: Option<String>,
    /// `run.mcp` as carried; absent when the trigger names no server. Kept as any JSON, so that
    /// a list another version (or a hand) wrote wrongly is judged at admission
    /// (`mcp-list-invalid`) rather than making the whole job unreadable.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mcp: Option<McpField>,
    /// The names of `run.secrets` (their values are resolved on the host later, never stored here).
    #[serde(default)]
    pub secrets: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub models: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max_cost_usd: Option<f64>,
    #[serde(default)]
    pub exclude_tools: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub image: Option<String>,
    /// A local job's repository folder (an absolute path): the job's workspace.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub folder: Option<String>,
    /// A local job's task: its prompt.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub task: Option<String>,
    /// The secrets profile whose resolver fills `secrets` (the trigger's, when it names secrets).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub secrets_profile: Option<String>,
    /// The forge event that queued a github or gitlab job (from the receiver).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub event: Option<ForgeEvent>,
    /// `run.labels`: the labels a worker must carry to take the job.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub labels: Vec<String>,
    /// The host that queued a local job (its folder is there), as `PI_HOST_NAME` names it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub host: Option<String>,
    /// The job this one runs again (`pi-dispatch rerun`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rerun_of: Option<String>,
    /// `run.pins`: what the job does with a server's tools that no longer match their pin
    /// (`None`: the default, withhold them).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub pins: Option<crate::pins::PinPolicy>,
}

/// The most labels a trigger asks for, or a worker carries.
pub const MAX_LABELS: usize = 16;

/// Whether `label` is one a worker may carry and a trigger ask for: 1 to 63 lowercase letters,
/// digits, '.', '_' and '-', beginning with a letter or digit, optionally `key:value` (each part
/// of that shape), as `gpu`, `zone:eu`, `host:build-1`.
pub fn is_label(label: &str) -> bool {
    let part = |p: &str| {
        p.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && p.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
    };
    label.len() <= 63
        && match label.split_once(':') {
            Some((key, value)) => part(key) && part(value),
            None => part(label),
        }
}

/// The label every worker carries for its host: `host:NAME`.
pub fn host_label(host: &str) -> String {
    format!("host:{host}")
}

impl Job {
    /// A job with its id, trigger type and kind, and nothing else yet.
    pub fn new(id: impl Into<String>, trigger_type: &str, kind: &str) -> Job {
        Job {
            id: id.into(),
            trigger_index: None,
            trigger_type: trigger_type.to_owned(),
            kind: kind.to_owned(),
            flow: None,
            command: None,
            mcp: None,
            secrets: Vec::new(),
            provider: None,
            model: None,
            models: None,
            max_cost_usd: None,
            exclude_tools: Vec::new(),
            image: None,
            folder: None,
            task: None,
            secrets_profile: None,
            event: None,
            labels: Vec::new(),
            host: None,
            rerun_of: None,
            pins: None,
        }
    }

    /// The labels a worker must carry to take the job: its trigger's `run.labels` when it has
    /// some; otherwise, for a local job, its host's (the folder is there); otherwise none.
    pub fn needs(&self) -> Vec<String> {
        if !self.labels.is_empty() {
            let mut needs = self.labels.clone();
            needs.sort();
            needs.dedup();
            return needs;
        }
        match (&self.host, self.kind()) {
            (Some(host), Some(Kind::Local)) => vec![host_label(host)],
            _ => Vec::new(),
        }
    }

    /// The group of jobs that run one at a time with this one: a forge job's issue or pull
    /// (merge) request, `github:owner/name#12`, `gitlab:group/project!3` (GitHub numbers its
    /// issues and pull requests together; GitLab apart).
    pub fn group(&self) -> Option<String> {
        self.event.as_ref().map(|e| {
            let mark = match (e.forge, e.pull_request) {
                (crate::forge_event::Forge::Gitlab, true) => '!',
                _ => '#',
            };
            format!("{}:{}{mark}{}", e.forge.as_str(), e.repository, e.number)
        })
    }

    /// The job's kind, when it is one pi-dispatch knows.
    pub fn kind(&self) -> Option<Kind> {
        Kind::parse(&self.kind)
    }

    /// The servers the job names, when it names a well-formed list (`None` when it names none).
    pub fn mcp_names(&self) -> Option<&[String]> {
        self.mcp.as_ref().and_then(McpField::as_names)
    }

    /// The providers on the job's model list, with `provider` (the job's own, its trigger's or
    /// the deployment's default) (`None`: no list, so every provider pi knows).
    pub fn listed_providers(&self, provider: Option<&str>) -> Option<Vec<String>> {
        let models = self.models.as_ref()?;
        // A list that is empty or holds an entry without a provider is not one the loader writes:
        // it narrows nothing, so every provider's key stays reserved.
        if models.is_empty() || models.iter().any(|m| !m.contains('/')) {
            return None;
        }
        let mut providers: Vec<String> = models
            .iter()
            .filter_map(|m| m.split_once('/').map(|(p, _)| p.to_owned()))
            .collect();
        providers.extend(provider.map(str::to_owned));
        providers.sort();
        providers.dedup();
        Some(providers)
    }
}

/// Where a job runs and which forge it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// On the worker's own host, started by cron only (a cron job holds no forge token).
    Local,
    Github,
    Gitlab,
    Forgejo,
    Azure,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Local,
        Kind::Github,
        Kind::Gitlab,
        Kind::Forgejo,
        Kind::Azure,
    ];

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Local => "local",
            Kind::Github => "github",
            Kind::Gitlab => "gitlab",
            Kind::Forgejo => "forgejo",
            Kind::Azure => "azure",
        }
    }

    /// Whether a job of this kind may name the forge's own MCP server (github and gitlab only).
    pub fn allows_forge_mcp(self) -> bool {
        matches!(self, Kind::Github | Kind::Gitlab)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
