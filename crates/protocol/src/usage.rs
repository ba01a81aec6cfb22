//! What a job used, as the runner reports it on its exit line and the record keeps it: the tool
//! calls per server and tool, and what the agent's model spent.

use serde::{Deserialize, Serialize};

/// The tool name under which calls are counted that name no tool the server listed, or a name
/// longer than [`MAX_TOOL_NAME`], or a tool past [`MAX_TOOL_ENTRIES`]: whatever pi sends, the
/// counts keep a bounded size.
pub const OTHER_TOOL: &str = "(other)";

/// The longest tool name counted under its own name, in bytes.
pub const MAX_TOOL_NAME: usize = 128;

/// The most tools counted each under its own name, over all of a job's servers.
pub const MAX_TOOL_ENTRIES: usize = 512;

/// How the tool calls to one tool of one server went: counts, time and result size, never the
/// arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolCallCount {
    pub server: String,
    pub tool: String,
    /// Every call pi made, refused ones included.
    pub calls: u64,
    /// Answered with a result that is not an error.
    pub ok: u64,
    /// Answered with an error result (`isError`) or a JSON-RPC error, or cut short.
    pub error: u64,
    /// Refused before reaching the server: withheld, or not listed at connect.
    pub refused: u64,
    /// Time spent on the calls that reached the server, in milliseconds.
    pub total_ms: u64,
    /// Bytes of the results, as JSON.
    pub result_bytes: u64,
}

/// What pi spent (turns, tokens, cost), and the model that answered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Usage {
    /// Answers the model really gave (an error or an aborted answer is not one).
    pub turns: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    /// US dollars, as pi priced it.
    pub cost_usd: f64,
    pub provider: Option<String>,
    pub model: Option<String>,
}

impl Usage {
    /// Whether the model provider counted anything: tokens or cost.
    pub fn spent(&self) -> bool {
        self.input_tokens > 0
            || self.output_tokens > 0
            || self.total_tokens > 0
            || self.cost_usd > 0.0
    }
}
