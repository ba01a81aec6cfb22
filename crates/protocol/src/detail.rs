//! The detail of a refusal or a failure: which server, field, variable, host, path or user it
//! concerns, by name, never a value. Records keep it, `runs show` prints it, and the worker's log
//! line carries it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Detail {
    /// The MCP server the rule concerns (a validated name, or `forge`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Every server the rule concerns, when it concerns more than one (`server` is the first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<String>,
    /// The field of a file or a trigger (`run.models`, `mcpServers.docs.url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Variable names (never their values).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variables: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// A file or folder of the deployment, or the job's repository folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A host user, by uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The provider and model, as `provider/model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// What was found, in words made of the names above and fixed text.
    pub why: String,
}

impl Detail {
    /// What it concerns, each as `KIND NAME` (`server docs`, `host example.org port 443`), for
    /// people.
    pub fn concerns(&self) -> Vec<String> {
        let mut names = Vec::new();
        if let Some(s) = &self.server {
            names.push(format!("server {s}"));
        }
        if let Some(f) = &self.field {
            names.push(format!("field {f}"));
        }
        if !self.variables.is_empty() {
            names.push(format!("variables {}", self.variables.join(", ")));
        }
        if let Some(h) = &self.host {
            names.push(format!("host {h} port {}", self.port.unwrap_or(0)));
        }
        if let Some(p) = &self.path {
            names.push(format!("path {p}"));
        }
        if let Some(u) = self.uid {
            names.push(format!("uid {u}"));
        }
        if let Some(m) = &self.model {
            names.push(format!("model {m}"));
        }
        names
    }

    pub fn new(why: impl Into<String>) -> Detail {
        Detail {
            why: why.into(),
            ..Detail::default()
        }
    }

    pub fn server(mut self, name: &str) -> Detail {
        self.server = Some(name.to_owned());
        self
    }

    pub fn field(mut self, field: impl Into<String>) -> Detail {
        self.field = Some(field.into());
        self
    }

    pub fn variable(mut self, name: impl Into<String>) -> Detail {
        self.variables.push(name.into());
        self
    }

    pub fn variables(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Detail {
        self.variables.extend(names.into_iter().map(Into::into));
        self
    }

    pub fn host(mut self, host: impl Into<String>, port: u16) -> Detail {
        self.host = Some(host.into());
        self.port = Some(port);
        self
    }

    pub fn path(mut self, path: impl Into<String>) -> Detail {
        self.path = Some(path.into());
        self
    }

    pub fn uid(mut self, uid: u32) -> Detail {
        self.uid = Some(uid);
        self
    }

    pub fn model(mut self, model: impl Into<String>) -> Detail {
        self.model = Some(model.into());
        self
    }
}
