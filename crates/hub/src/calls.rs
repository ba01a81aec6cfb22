//! What the hub refuses and counts of the tool calls: the tools a job withholds from a server, and
//! the count of every call pi makes, by server and tool.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use protocol::usage::{MAX_TOOL_ENTRIES, MAX_TOOL_NAME, OTHER_TOOL, ToolCallCount};

/// The GitHub forge server's tools the job withholds (merging, approving, starting Copilot). The
/// last two are how github-mcp-server 0.12 (the build tested here) submits a review, which may
/// approve: what later versions fold into `pull_request_review_write`.
pub const GITHUB_WITHHELD: [&str; 6] = [
    "merge_pull_request",
    "pull_request_review_write",
    "assign_copilot_to_issue",
    "request_copilot_review",
    "create_and_submit_pull_request_review",
    "submit_pending_pull_request_review",
];

/// The GitLab forge server's tools the job withholds (merging, approving, more toolsets, GraphQL).
pub const GITLAB_WITHHELD: [&str; 6] = [
    "merge_merge_request",
    "approve_merge_request",
    "unapprove_merge_request",
    "approve_deployment",
    "discover_tools",
    "execute_graphql",
];

/// Tools of one server left out of every tool list and refused on every call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Withheld(pub Vec<String>);

impl Withheld {
    /// Nothing withheld (every overlay server).
    pub fn none() -> Withheld {
        Withheld(Vec::new())
    }

    pub fn new<I, S>(names: I) -> Withheld
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Withheld(names.into_iter().map(Into::into).collect())
    }

    /// What the job withholds from GitHub's forge server.
    pub fn github() -> Withheld {
        Withheld::new(GITHUB_WITHHELD)
    }

    /// What the job withholds from GitLab's forge server.
    pub fn gitlab() -> Withheld {
        Withheld::new(GITLAB_WITHHELD)
    }

    pub fn contains(&self, tool: &str) -> bool {
        self.0.iter().any(|t| t == tool)
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum CallOutcome {
    Ok,
    Error,
    Refused,
}

#[derive(Debug, Default)]
pub(crate) struct ToolCalls(Mutex<BTreeMap<(String, String), ToolCallCount>>);

impl ToolCalls {
    /// Counts one call of `tool` of `server`. `listed`: the server listed the tool (or the job
    /// withholds it by name); any other name is counted as [`OTHER_TOOL`], as is a name too long or
    /// a tool past the most kept, so that what pi sends never decides how large the counts grow.
    pub(crate) fn record(
        &self,
        server: &str,
        tool: &str,
        listed: bool,
        outcome: CallOutcome,
        took: Duration,
        bytes: usize,
    ) {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let own = listed
            && tool.len() <= MAX_TOOL_NAME
            && (all.len() < MAX_TOOL_ENTRIES
                || all.contains_key(&(server.to_owned(), tool.to_owned())));
        let tool = if own { tool } else { OTHER_TOOL };
        let count = all
            .entry((server.to_owned(), tool.to_owned()))
            .or_insert_with(|| ToolCallCount {
                server: server.to_owned(),
                tool: tool.to_owned(),
                ..ToolCallCount::default()
            });
        count.calls += 1;
        match outcome {
            CallOutcome::Ok => count.ok += 1,
            CallOutcome::Error => count.error += 1,
            CallOutcome::Refused => count.refused += 1,
        }
        count.total_ms += u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        count.result_bytes += u64::try_from(bytes).unwrap_or(u64::MAX);
    }

    pub(crate) fn snapshot(&self) -> Vec<ToolCallCount> {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_pi_sends_never_decides_how_large_the_counts_grow() {
        let calls = ToolCalls::default();
        let record = |tool: &str, listed| {
            calls.record(
                "docs",
                tool,
                listed,
                CallOutcome::Refused,
                Duration::ZERO,
                0,
            );
        };
        for i in 0..400 {
            record(&format!("{}{i}", "x".repeat(3000)), false);
        }
        record("search", true);
        record(&"y".repeat(MAX_TOOL_NAME + 1), true);
        for i in 0..2 * MAX_TOOL_ENTRIES {
            record(&format!("tool-{i}"), true);
        }
        record("search", true);
        let all = calls.snapshot();
        assert_eq!(all.len(), MAX_TOOL_ENTRIES);
        // Nothing is lost: every call is counted, under its own name or with the others.
        let made = 400 + 1 + 1 + 2 * MAX_TOOL_ENTRIES as u64 + 1;
        assert_eq!(all.iter().map(|c| c.calls).sum::<u64>(), made);
        let other = all.iter().find(|c| c.tool == OTHER_TOOL).unwrap();
        // 400 unlisted, one too long, and every listed tool past the bound.
        let own_tools = MAX_TOOL_ENTRIES as u64 - 2;
        assert_eq!(
            other.calls,
            400 + 1 + (2 * MAX_TOOL_ENTRIES as u64 - own_tools)
        );
        let search = all.iter().find(|c| c.tool == "search").unwrap();
        assert_eq!(
            search.calls, 2,
            "a tool counted already keeps its own entry"
        );
    }
}
