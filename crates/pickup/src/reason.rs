//! The reason tokens: the product's vocabulary for why a job was refused or stopped.
//!
//! One enum for both of the spec's tables (refused at pickup, stopped in the job), each token with its
//! fixed public sentence. A sentence may name the server and the rule, never a host, a variable or a
//! value: the worker's log carries those.

use std::fmt;

use serde::Serialize;

/// Why pickup refused a job (`policy`), before anything was spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    McpListInvalid,
    McpConfigInvalid,
    McpServerUnknown,
    McpSecretReserved,
    McpSecretUnmapped,
    McpEgressUnreachable,
    McpPackageRunner,
    McpExcluded,
    JobImageMcpUnsupported,
    JobImageForgeMcpUnsupported,
    TriggerSkew,
}

impl Reason {
    pub const ALL: [Reason; 11] = [
        Reason::McpListInvalid,
        Reason::McpConfigInvalid,
        Reason::McpServerUnknown,
        Reason::McpSecretReserved,
        Reason::McpSecretUnmapped,
        Reason::McpEgressUnreachable,
        Reason::McpPackageRunner,
        Reason::McpExcluded,
        Reason::JobImageMcpUnsupported,
        Reason::JobImageForgeMcpUnsupported,
        Reason::TriggerSkew,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::McpListInvalid => "mcp-list-invalid",
            Reason::McpConfigInvalid => "mcp-config-invalid",
            Reason::McpServerUnknown => "mcp-server-unknown",
            Reason::McpSecretReserved => "mcp-secret-reserved",
            Reason::McpSecretUnmapped => "mcp-secret-unmapped",
            Reason::McpEgressUnreachable => "mcp-egress-unreachable",
            Reason::McpPackageRunner => "mcp-package-runner",
            Reason::McpExcluded => "mcp-excluded",
            Reason::JobImageMcpUnsupported => "job-image-mcp-unsupported",
            Reason::JobImageForgeMcpUnsupported => "job-image-forge-mcp-unsupported",
            Reason::TriggerSkew => "trigger-skew",
        }
    }

    /// The worker's log event for a refusal of this table: `refused_mcp`, as the spec names it
    /// (the reason itself rides in the line's `reason` field).
    pub fn log_event(self) -> &'static str {
        "refused_mcp"
    }

    /// The fixed comment posted on the issue. `server` is the server the rule concerns, when there
    /// is one (a validated name, or `forge`); nothing else is ever put in.
    pub fn comment(self, server: Option<&str>) -> String {
        let subject = match server {
            Some(name) => format!("the MCP server `{name}`"),
            None => "an MCP server it names".to_owned(),
        };
        let why = match self {
            Reason::McpListInvalid => {
                "the list of MCP servers the job carries is not one pi-dispatch writes".to_owned()
            }
            Reason::McpConfigInvalid => {
                "the overlay's MCP configuration (mcp.json, or the models.json it is judged with) is missing or cannot be read".to_owned()
            }
            Reason::McpServerUnknown => format!("{subject} is not offered to jobs"),
            Reason::McpSecretReserved => format!(
                "{subject} references a credential reserved for the job itself (a provider key, the forge token, or a proxy or runner variable)"
            ),
            Reason::McpSecretUnmapped => {
                format!("{subject} references a variable the job will not have")
            }
            Reason::McpEgressUnreachable => {
                format!("the egress policy would not let the job reach {subject}")
            }
            Reason::McpPackageRunner => format!(
                "the egress policy would not let the package runner of {subject} reach its registry"
            ),
            Reason::McpExcluded => {
                format!("the trigger's excludeTools leaves {subject} no way in")
            }
            Reason::JobImageMcpUnsupported => {
                "the job image does not declare the mcp capability".to_owned()
            }
            Reason::JobImageForgeMcpUnsupported => {
                "the job image does not declare the forgeMcp capability".to_owned()
            }
            Reason::TriggerSkew => {
                "the trigger as it stands now narrows what its jobs may do (MCP servers, model list, cost cap or excluded tools), and the job arrived without that".to_owned()
            }
        };
        format!(
            "pi-dispatch did not start this job: {why} (rule {}). Nothing was spent; the worker's log has the details.",
            self.as_str()
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the job's runner stopped before the prompt, on its exit line, with its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunnerReason {
    McpUnavailable,
    McpUnreachable,
    McpShadowed,
    McpCommandMissing,
    McpSecretMissing,
    McpConfigMismatch,
    McpConfigInvalid,
}

impl RunnerReason {
    pub const ALL: [RunnerReason; 7] = [
        RunnerReason::McpUnavailable,
        RunnerReason::McpUnreachable,
        RunnerReason::McpShadowed,
        RunnerReason::McpCommandMissing,
        RunnerReason::McpSecretMissing,
        RunnerReason::McpConfigMismatch,
        RunnerReason::McpConfigInvalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunnerReason::McpUnavailable => "mcp-unavailable",
            RunnerReason::McpUnreachable => "mcp-unreachable",
            RunnerReason::McpShadowed => "mcp-shadowed",
            RunnerReason::McpCommandMissing => "mcp-command-missing",
            RunnerReason::McpSecretMissing => "mcp-secret-missing",
            RunnerReason::McpConfigMismatch => "mcp-config-mismatch",
            RunnerReason::McpConfigInvalid => "mcp-config-invalid",
        }
    }

    /// The exit code: 1 is retried like any infrastructure failure, 2 never is.
    pub fn code(self) -> u8 {
        match self {
            RunnerReason::McpUnreachable => 1,
            _ => 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's pickup table and its in-job table, as (token, code) rows. The test below also
    /// reads the spec itself when it is beside the repository, so the two cannot drift.
    const PICKUP_TABLE: [&str; 11] = [
        "mcp-list-invalid",
        "mcp-config-invalid",
        "mcp-server-unknown",
        "mcp-secret-reserved",
        "mcp-secret-unmapped",
        "mcp-egress-unreachable",
        "mcp-package-runner",
        "mcp-excluded",
        "job-image-mcp-unsupported",
        "job-image-forge-mcp-unsupported",
        "trigger-skew",
    ];
    const JOB_TABLE: [(&str, u8); 7] = [
        ("mcp-unavailable", 2),
        ("mcp-unreachable", 1),
        ("mcp-shadowed", 2),
        ("mcp-command-missing", 2),
        ("mcp-secret-missing", 2),
        ("mcp-config-mismatch", 2),
        ("mcp-config-invalid", 2),
    ];

    #[test]
    fn tokens_match_the_spec_tables() {
        let ours: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(ours, PICKUP_TABLE);
        let ours: Vec<(&str, u8)> = RunnerReason::ALL
            .iter()
            .map(|r| (r.as_str(), r.code()))
            .collect();
        assert_eq!(ours, JOB_TABLE);
        for r in Reason::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
    }

    /// Reads the spec's tables from `shared/spec/mcp.md` beside the repository (where the workplace
    /// lays it, for development and CI) and compares them with the rows above.
    #[test]
    fn the_rows_above_are_the_spec_tables() {
        let spec =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/spec/mcp.md");
        let Ok(text) = std::fs::read_to_string(&spec) else {
            // Outside the workplace the spec is not beside the repository; the rows above stand.
            eprintln!(
                "spec not found at {}; compared with the embedded rows only",
                spec.display()
            );
            return;
        };
        let pickup_start = text.find("Reason Why").unwrap();
        let pickup_end = text[pickup_start..]
            .find("The comment on the issue")
            .unwrap()
            + pickup_start;
        let pickup: Vec<&str> = text[pickup_start..pickup_end]
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(pickup, PICKUP_TABLE);
        let job_start = text.find("Reason Code Why").unwrap();
        let job_end = text[job_start..].find("Each reason with code 2").unwrap() + job_start;
        let mut job: Vec<(String, u8)> = Vec::new();
        for line in text[job_start..job_end].lines().skip(1) {
            let words: Vec<&str> = line.split_whitespace().collect();
            // "mcp-config-mismatch, mcp-config-invalid 2 ..." names two tokens in one row.
            let code_at = words.iter().position(|w| *w == "1" || *w == "2");
            if let Some(at) = code_at {
                for w in &words[..at] {
                    job.push((
                        w.trim_end_matches(',').to_owned(),
                        words[at].parse().unwrap(),
                    ));
                }
            }
        }
        let expected: Vec<(String, u8)> =
            JOB_TABLE.iter().map(|(t, c)| (t.to_string(), *c)).collect();
        assert_eq!(job, expected);
    }

    #[test]
    fn comments_name_the_server_and_rule_only() {
        for r in Reason::ALL {
            let c = r.comment(Some("docs"));
            assert!(c.contains(r.as_str()), "{c}");
            assert!(c.starts_with("pi-dispatch did not start this job"), "{c}");
            assert!(!c.contains("${") && !c.contains('$'), "{c}");
        }
        assert_eq!(Reason::McpSecretUnmapped.log_event(), "refused_mcp");
    }
}
