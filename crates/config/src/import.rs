//! What `import-pi` stages from the host's pi `mcp.json`: a pure plan over the file's bytes.
//!
//! The host file is pi's own, so its top level may hold pi settings beyond `mcpServers`; those are
//! noted and not carried over. Each server is judged by the overlay's rules ([`crate::mcp`]): a valid,
//! turned-on server is staged exactly as the host wrote it; every other one is left behind with its
//! reasons. Nothing is repaired.

use crate::json::{self, Json, JsonError, Object};
use crate::mcp::{self, ServerEntry, TransportKind};
use crate::problem::{Problem, printable_key};

/// Why the host's file cannot be read; the overlay's file is then left exactly as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostFileError {
    #[error("it is larger than {} MiB", mcp::MAX_FILE_BYTES / (1024 * 1024))]
    TooLarge,
    #[error("it is not UTF-8 text")]
    NotUtf8,
    #[error("it is {0}")]
    Json(JsonError),
    #[error("its top level is not a JSON object")]
    NotAnObject,
    #[error("its 'mcpServers' is not an object")]
    ServersNotObject,
}

/// A server that will be in the overlay.
#[derive(Debug, Clone, PartialEq)]
pub struct Staged {
    pub name: String,
    pub transport: TransportKind,
    /// Variable names the entry references.
    pub references: Vec<String>,
    pub package_runner: Option<&'static str>,
    entry: Json,
}

/// A server that stays on the host only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftBehind {
    pub name: String,
    pub transport: Option<TransportKind>,
    pub reason: LeftReason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeftReason {
    /// Valid, but `"enabled": false` on the host: no job could use it.
    TurnedOff,
    /// It breaks the overlay's rules; each problem says the rule and the fix.
    Refused(Vec<Problem>),
}

/// The plan for the overlay's `mcp.json`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct McpImport {
    pub staged: Vec<Staged>,
    pub left: Vec<LeftBehind>,
    /// Top-level keys of the host file other than `mcpServers` (pi settings), when printable.
    pub not_carried: Vec<String>,
}

impl McpImport {
    /// The overlay's new `mcp.json`, or `None` when no server is staged (the overlay then has none).
    pub fn overlay_file(&self) -> Option<String> {
        if self.staged.is_empty() {
            return None;
        }
        let servers = Object::from_members(
            self.staged
                .iter()
                .map(|s| (s.name.clone(), s.entry.clone()))
                .collect(),
        );
        let root = Object::from_members(vec![("mcpServers".to_owned(), Json::Object(servers))]);
        Some(json::to_pretty(&Json::Object(root)))
    }
}

/// Plans the import of the host's `mcp.json` from its bytes.
pub fn plan_mcp(bytes: &[u8]) -> Result<McpImport, HostFileError> {
    if bytes.len() > mcp::MAX_FILE_BYTES {
        return Err(HostFileError::TooLarge);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| HostFileError::NotUtf8)?;
    let Json::Object(root) = json::parse(text).map_err(HostFileError::Json)? else {
        return Err(HostFileError::NotAnObject);
    };
    let mut plan = McpImport::default();
    for (key, value) in root.iter() {
        if key == "mcpServers" {
            let Json::Object(servers) = value else {
                return Err(HostFileError::ServersNotObject);
            };
            for (name, entry) in servers.iter() {
                plan.judge(mcp::validate_entry(name, entry), entry);
            }
        } else {
            plan.not_carried
                .push(printable_key(key).unwrap_or("(a key)").to_owned());
        }
    }
    Ok(plan)
}

impl McpImport {
    fn judge(&mut self, verdict: ServerEntry, entry: &Json) {
        match verdict.verdict {
            Ok(server) if server.enabled => self.staged.push(Staged {
                name: verdict.name,
                transport: server.kind(),
                references: server.references().iter().map(|n| n.to_string()).collect(),
                package_runner: server.package_runner(),
                entry: entry.clone(),
            }),
            Ok(_) => self.left.push(LeftBehind {
                name: verdict.name,
                transport: verdict.transport,
                reason: LeftReason::TurnedOff,
            }),
            Err(problems) => self.left.push(LeftBehind {
                name: verdict.name,
                transport: verdict.transport,
                reason: LeftReason::Refused(problems),
            }),
        }
    }
}

/// The names under the top-level object `member` (`mcpServers` of an `mcp.json`, `providers` of a
/// `models.json`) of an overlay file an import replaces, that `kept` does not hold: what the
/// replacement drops (hand edits, most often), in file order. A file without that member drops
/// nothing; `None` when the file is not strict JSON or its member is not an object, so what it held
/// cannot be told.
pub fn dropped_names(old: &[u8], member: &str, kept: &[&str]) -> Option<Vec<String>> {
    let text = std::str::from_utf8(old).ok()?;
    let Json::Object(root) = json::parse(text).ok()? else {
        return None;
    };
    match root.get(member) {
        None => Some(Vec::new()),
        Some(Json::Object(names)) => Some(
            names
                .keys()
                .filter(|name| !kept.contains(name))
                .map(str::to_owned)
                .collect(),
        ),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::ProblemCode;

    const HOST: &str = r#"{
      "autoEnableCodemode": true,
      "mcpServers": {
        "docs": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}, "description": "Docs"},
        "leaky": {"url": "https://h.example.com/mcp", "headers": {"Authorization": "Bearer sk-live-1"}, "description": "Leaky"},
        "bang": {"command": "node", "env": {"K": "!op read x"}, "description": "Bang"},
        "dollar": {"command": "node", "env": {"K": "$K"}, "description": "Dollar"},
        "memory": {"command": "npx", "args": ["-y", "m"], "description": "Memory"},
        "runner": {"command": "npx", "args": ["-y", "m"], "allowPackageRunner": true, "description": "Runner"},
        "old": {"url": "https://old.example.com/mcp", "description": "Old", "enabled": false},
        "shout": {"url": "HTTPS://Shout.example.com:443/mcp", "description": "Shout"}
      }
    }"#;

    #[test]
    fn stages_only_what_a_job_can_use() {
        let plan = plan_mcp(HOST.as_bytes()).unwrap();
        let staged: Vec<&str> = plan.staged.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(staged, ["docs", "runner"]);
        assert_eq!(plan.staged[0].references, ["DOCS_TOKEN"]);
        assert_eq!(plan.staged[1].package_runner, Some("npx"));
        let left: Vec<(&str, Option<ProblemCode>)> = plan
            .left
            .iter()
            .map(|l| {
                let code = match &l.reason {
                    LeftReason::TurnedOff => None,
                    LeftReason::Refused(p) => Some(p[0].code),
                };
                (l.name.as_str(), code)
            })
            .collect();
        assert_eq!(
            left,
            [
                ("leaky", Some(ProblemCode::HeaderLiteral)),
                ("bang", Some(ProblemCode::EnvLiteral)),
                ("dollar", Some(ProblemCode::EnvLiteral)),
                ("memory", Some(ProblemCode::PackageRunner)),
                ("old", None),
                ("shout", Some(ProblemCode::UrlNotPlain)),
            ]
        );
        assert_eq!(plan.not_carried, ["autoEnableCodemode"]);
    }

    #[test]
    fn the_staged_file_is_a_valid_overlay_holding_the_entries_as_written() {
        let plan = plan_mcp(HOST.as_bytes()).unwrap();
        let text = plan.overlay_file().unwrap();
        let overlay = mcp::parse_overlay(text.as_bytes()).unwrap();
        assert!(overlay.all_valid());
        assert_eq!(overlay.servers.len(), 2);
        assert!(
            text.contains(r#""Authorization": "Bearer ${DOCS_TOKEN}""#),
            "{text}"
        );
        assert!(!text.contains("sk-live-1"));
        assert!(!text.contains("autoEnableCodemode"));
    }

    #[test]
    fn nothing_usable_means_no_overlay_file() {
        for host in [
            r#"{"mcpServers": {}}"#,
            r#"{}"#,
            r#"{"mcpServers": {"old": {"url": "https://h/mcp", "description": "d", "enabled": false}}}"#,
        ] {
            assert_eq!(
                plan_mcp(host.as_bytes()).unwrap().overlay_file(),
                None,
                "{host}"
            );
        }
    }

    #[test]
    fn the_names_a_replacement_drops_are_told_in_file_order() {
        let old =
            br#"{"mcpServers": {"mine": {}, "docs": {"url": 5}, "z-hand": "not even an entry"}}"#;
        assert_eq!(
            dropped_names(old, "mcpServers", &["docs", "new"]),
            Some(vec!["mine".to_owned(), "z-hand".to_owned()])
        );
        assert_eq!(
            dropped_names(old, "mcpServers", &["mine", "docs", "z-hand"]),
            Some(vec![])
        );
        let models = br#"{"providers": {"local": {"apiKey": "sk-literal"}, "openai": {}}}"#;
        assert_eq!(
            dropped_names(models, "providers", &["openai"]),
            Some(vec!["local".to_owned()])
        );
        assert_eq!(dropped_names(b"{}", "providers", &[]), Some(vec![]));
        for unreadable in [&b"{,}"[..], b"[]", br#"{"providers": []}"#, b"\xff"] {
            assert_eq!(dropped_names(unreadable, "providers", &[]), None);
        }
    }

    #[test]
    fn an_unreadable_host_file_is_an_error() {
        for (host, want) in [
            ("{\"mcpServers\": {},}", "not JSON"),
            ("{\"mcpServers\": {}, \"mcpServers\": {}}", "written twice"),
            ("[]", "top level"),
            ("{\"mcpServers\": []}", "'mcpServers'"),
        ] {
            let err = plan_mcp(host.as_bytes()).unwrap_err();
            assert!(err.to_string().contains(want), "{host}: {err}");
        }
    }
}
