//! The most a model request can be billed for, read from its body as its wire format defines it,
//! so that the gateway can hold a job's cost cap against any request, pi's own or one a hijacked
//! tool writes by hand.
//!
//! Every top-level field of a request is known here, per wire format: a field that sets how much
//! the call may produce (the output limit under each of its names, `n`, a reasoning budget) is
//! counted; a field that changes nothing of the cost (sampling, caching keys, streaming) passes;
//! anything else (a provider-run tool such as web search, a stored conversation or prompt the
//! request only names, a fallback model, an audio output, a field this list does not know) leaves
//! the call without a bound, and the gateway refuses it under a cap with the field named.
//!
//! The input side is bounded from the request's size: a byte-level tokenizer never makes more
//! tokens than the text has bytes, each image is allowed [`IMAGE_TOKENS`] whatever its size (a
//! small or linked image can cost more than its bytes), and [`OVERHEAD_TOKENS`] stand for what
//! the provider wraps around every request (its template for tools and roles).

use serde_json::Value;

use crate::wire_format::Api;

/// The most input tokens one image in a request is counted for, whatever its bytes: above what
/// the providers' own rules give the largest image they accept after resizing it.
pub const IMAGE_TOKENS: u64 = 10_000;

/// The input tokens a provider may add around every request (its system text for tools, the
/// markers around each message).
pub const OVERHEAD_TOKENS: u64 = 2_048;

/// What a request can be billed for at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Worst {
    /// Input tokens, cache reads and writes included.
    pub input: u64,
    /// The largest output of one answer the request sets (the largest of its limit fields), or
    /// `None` when it sets none (the model's own limit then holds).
    pub output: Option<u64>,
    /// A reasoning budget the request sets, in tokens.
    pub budget: u64,
    /// Whether the budget is spent inside the output limit (Anthropic's `thinking`): one answer
    /// then costs the larger of the two, else their sum.
    pub budget_within: bool,
    /// How many answers the request asks for (`n`).
    pub choices: u64,
}

impl Worst {
    /// The output tokens the request can be billed for, with `model_limit` standing in for a
    /// limit the request does not set.
    pub fn output_tokens(&self, model_limit: Option<u64>) -> Option<u64> {
        let limit = self.output.or(model_limit)?;
        let one = if self.budget_within {
            limit.max(self.budget)
        } else {
            limit.saturating_add(self.budget)
        };
        Some(one.saturating_mul(self.choices))
    }
}

/// The field of a request that leaves its cost without a bound, as a message may show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unbounded {
    pub field: String,
}

fn unbounded(field: impl Into<String>) -> Unbounded {
    Unbounded {
        field: field.into(),
    }
}

/// A key the request chose, as a message may show it: a plain name as it is, anything else
/// described (the request is the job's text, and a message is the operator's).
fn shown(key: &str) -> String {
    let plain = key.len() <= 40
        && key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if plain {
        key.to_owned()
    } else {
        "a field of an unusual name".to_owned()
    }
}

/// How one top-level field of a wire format counts.
#[derive(Clone, Copy)]
enum Field {
    /// Changes nothing of what the call can cost.
    Free,
    /// An output limit (the largest of them is the one counted).
    Limit,
    /// A reasoning budget in tokens.
    Budget,
    /// `n`: how many answers.
    Choices,
    /// The tools offered to the model: each must be one the caller runs.
    Tools,
    /// A field whose value decides (checked by [`checked`]).
    Checked,
}

/// Every top-level field a wire format's requests may have, and how it counts. A field not here
/// leaves the request unbounded.
fn fields(api: Api) -> &'static [(&'static str, Field)] {
    match api {
        Api::OpenAiCompletions => &OPENAI_COMPLETIONS_FIELDS,
        Api::OpenAiResponses => &OPENAI_RESPONSES_FIELDS,
        Api::AnthropicMessages => &ANTHROPIC_MESSAGES_FIELDS,
        Api::OpenAiDecisions => &OPENAI_DECISIONS_FIELDS,
        Api::SystemOne => &SYSTEM_ONE_FIELDS,
        Api::OpenRouterImages => &OPENROUTER_IMAGES_FIELDS,
    }
}

/// pi-ai's chat completions (every compat format), and the OpenAI fields that cost nothing.
const OPENAI_COMPLETIONS_FIELDS: [(&str, Field); 45] = [
    ("model", Field::Free),
    ("messages", Field::Free),
    ("stream", Field::Free),
    ("stream_options", Field::Free),
    ("store", Field::Free),
    ("prompt_cache_key", Field::Free),
    ("prompt_cache_retention", Field::Free),
    ("temperature", Field::Free),
    ("top_p", Field::Free),
    ("top_k", Field::Free),
    ("min_p", Field::Free),
    ("repetition_penalty", Field::Free),
    ("frequency_penalty", Field::Free),
    ("presence_penalty", Field::Free),
    ("stop", Field::Free),
    ("seed", Field::Free),
    ("logit_bias", Field::Free),
    ("logprobs", Field::Free),
    ("top_logprobs", Field::Free),
    ("response_format", Field::Free),
    ("parallel_tool_calls", Field::Free),
    ("tool_choice", Field::Free),
    ("tool_stream", Field::Free),
    ("user", Field::Free),
    ("metadata", Field::Free),
    ("safety_identifier", Field::Free),
    ("verbosity", Field::Free),
    ("priority", Field::Free),
    ("reasoning_effort", Field::Free),
    ("enable_thinking", Field::Free),
    ("chat_template_kwargs", Field::Free),
    ("chat_template_args", Field::Free),
    ("provider", Field::Free),
    ("providerOptions", Field::Free),
    ("max_tokens", Field::Limit),
    ("max_completion_tokens", Field::Limit),
    ("thinking_token_budget", Field::Budget),
    ("thinking_budget", Field::Budget),
    ("thinking_budget_tokens", Field::Budget),
    ("n", Field::Choices),
    ("tools", Field::Tools),
    ("thinking", Field::Checked),
    ("reasoning", Field::Checked),
    ("modalities", Field::Checked),
    ("service_tier", Field::Checked),
];

/// The responses API's fields.
const OPENAI_RESPONSES_FIELDS: [(&str, Field); 24] = [
    ("model", Field::Free),
    ("input", Field::Free),
    ("instructions", Field::Free),
    ("stream", Field::Free),
    ("stream_options", Field::Free),
    ("store", Field::Free),
    ("prompt_cache_key", Field::Free),
    ("prompt_cache_retention", Field::Free),
    ("prompt_cache_options", Field::Free),
    ("temperature", Field::Free),
    ("top_p", Field::Free),
    ("top_logprobs", Field::Free),
    ("tool_choice", Field::Free),
    ("parallel_tool_calls", Field::Free),
    ("include", Field::Free),
    ("text", Field::Free),
    ("truncation", Field::Free),
    ("user", Field::Free),
    ("metadata", Field::Free),
    ("safety_identifier", Field::Free),
    ("max_output_tokens", Field::Limit),
    ("tools", Field::Tools),
    ("reasoning", Field::Checked),
    ("service_tier", Field::Checked),
];

/// Anthropic's messages API's fields.
const ANTHROPIC_MESSAGES_FIELDS: [(&str, Field); 16] = [
    ("model", Field::Free),
    ("messages", Field::Free),
    ("system", Field::Free),
    ("stream", Field::Free),
    ("temperature", Field::Free),
    ("top_p", Field::Free),
    ("top_k", Field::Free),
    ("stop_sequences", Field::Free),
    ("tool_choice", Field::Free),
    ("metadata", Field::Free),
    ("max_tokens", Field::Limit),
    ("tools", Field::Tools),
    ("thinking", Field::Checked),
    ("output_config", Field::Checked),
    ("thread", Field::Checked),
    ("service_tier", Field::Checked),
];

/// OpenAI decisions' fields: the model, its input and the questions.
const OPENAI_DECISIONS_FIELDS: [(&str, Field); 3] = [
    ("model", Field::Free),
    ("input", Field::Free),
    ("questions", Field::Free),
];

/// System One's classifier fields.
const SYSTEM_ONE_FIELDS: [(&str, Field); 5] = [
    ("model", Field::Free),
    ("state", Field::Free),
    ("questions", Field::Free),
    ("assets", Field::Free),
    ("images", Field::Free),
];

/// OpenRouter's image generation fields.
const OPENROUTER_IMAGES_FIELDS: [(&str, Field); 4] = [
    ("model", Field::Free),
    ("messages", Field::Free),
    ("stream", Field::Free),
    ("modalities", Field::Free),
];

/// Content parts whose cost is not in the request: a file or a document the provider reads (by
/// reference or by pages), audio, an item the provider stored.
const UNBOUNDED_PARTS: [&str; 6] = [
    "input_file",
    "file",
    "document",
    "input_audio",
    "audio",
    "item_reference",
];

/// Content parts that are images.
const IMAGE_PARTS: [&str; 3] = ["image_url", "input_image", "image"];

/// The worst case of a request of `bytes` bytes whose body is `body`, in wire format `api`.
pub fn read(body: &Value, bytes: usize, api: Api) -> Result<Worst, Unbounded> {
    let Some(object) = body.as_object() else {
        return Err(unbounded("the request's body, which is not a JSON object"));
    };
    let known = fields(api);
    let mut worst = Worst {
        input: 0,
        output: None,
        budget: 0,
        budget_within: api == Api::AnthropicMessages,
        choices: 1,
    };
    let mut images = 0u64;
    for (key, value) in object {
        let Some((_, field)) = known.iter().find(|(k, _)| k == key) else {
            return Err(unbounded(shown(key)));
        };
        match field {
            Field::Free => {}
            Field::Limit => {
                let n = count(value, key)?;
                worst.output = Some(worst.output.map_or(n, |o| o.max(n)));
            }
            Field::Budget => worst.budget = worst.budget.max(count(value, key)?),
            Field::Choices => worst.choices = count(value, key)?.max(1),
            Field::Tools => tools(value, api)?,
            Field::Checked => checked(api, key, value, &mut worst)?,
        }
        if key != "tools" {
            parts(value, &mut images)?;
        }
    }
    let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
    worst.input = bytes
        .saturating_add(images.saturating_mul(IMAGE_TOKENS))
        .saturating_add(OVERHEAD_TOKENS);
    Ok(worst)
}

/// A token count: a whole number, never negative.
fn count(value: &Value, key: &str) -> Result<u64, Unbounded> {
    value.as_u64().ok_or_else(|| unbounded(key.to_owned()))
}

/// The tools offered: functions (and OpenAI's custom tools) the caller runs, never one the
/// provider runs and bills (web search, code execution, a file search, a remote MCP server).
fn tools(value: &Value, api: Api) -> Result<(), Unbounded> {
    let Some(tools) = value.as_array() else {
        return Err(unbounded("tools"));
    };
    for (i, tool) in tools.iter().enumerate() {
        let kind = tool.get("type");
        let callers = match api {
            // Anthropic's own tools have a type; the caller's have none (or "custom").
            Api::AnthropicMessages => kind.is_none_or(|t| t == "custom"),
            _ => kind.is_some_and(|t| t == "function" || t == "custom"),
        };
        if !callers {
            return Err(unbounded(format!("tools[{i}].type")));
        }
    }
    Ok(())
}

/// The fields whose value decides whether they cost anything.
fn checked(api: Api, key: &str, value: &Value, worst: &mut Worst) -> Result<(), Unbounded> {
    let fail = || unbounded(key.to_owned());
    match (api, key) {
        // A budget under its own name, or an on/off switch.
        (_, "thinking") => {
            if let Some(budget) = value.get("budget_tokens") {
                worst.budget = worst.budget.max(count(budget, "thinking.budget_tokens")?);
            }
            Ok(())
        }
        (Api::OpenAiCompletions, "reasoning") => {
            let o = value.as_object().ok_or_else(fail)?;
            for (k, v) in o {
                match k.as_str() {
                    "effort" | "enabled" | "exclude" | "summary" => {}
                    "max_tokens" => {
                        worst.budget = worst.budget.max(count(v, "reasoning.max_tokens")?);
                    }
                    _ => return Err(unbounded(format!("reasoning.{}", shown(k)))),
                }
            }
            Ok(())
        }
        // The responses API spends reasoning inside `max_output_tokens`.
        (_, "reasoning") => {
            let o = value.as_object().ok_or_else(fail)?;
            match o
                .keys()
                .find(|k| !matches!(k.as_str(), "effort" | "summary" | "generate_summary"))
            {
                Some(k) => Err(unbounded(format!("reasoning.{}", shown(k)))),
                None => Ok(()),
            }
        }
        // Text only: an image or audio output is priced apart.
        (_, "modalities") => match value.as_array() {
            Some(m) if m.iter().all(|v| v == "text") => Ok(()),
            _ => Err(fail()),
        },
        // The standard tier (the catalog's prices) or a cheaper one, never a dearer one.
        (Api::AnthropicMessages, "service_tier") => match value.as_str() {
            Some("standard_only") => Ok(()),
            _ => Err(fail()),
        },
        (_, "service_tier") => match value.as_str() {
            Some("default" | "flex") => Ok(()),
            _ => Err(fail()),
        },
        // The effort, spent inside `max_tokens`, and the answer's format.
        (_, "output_config") => {
            let o = value.as_object().ok_or_else(fail)?;
            match o
                .keys()
                .find(|k| !matches!(k.as_str(), "effort" | "format"))
            {
                Some(k) => Err(unbounded(format!("output_config.{}", shown(k)))),
                None => Ok(()),
            }
        }
        // A new thread holds this request only; continuing one bills what the provider kept.
        (_, "thread") => match value.get("type").and_then(Value::as_str) {
            Some("create") => Ok(()),
            _ => Err(fail()),
        },
        _ => Err(fail()),
    }
}

/// Counts the images among the content parts under `value`, and refuses a part whose cost the
/// request does not hold (a file, a document, audio, a stored item).
fn parts(value: &Value, images: &mut u64) -> Result<(), Unbounded> {
    match value {
        Value::Array(items) => items.iter().try_for_each(|v| parts(v, images)),
        Value::Object(o) => {
            if let Some(kind) = o.get("type").and_then(Value::as_str) {
                if let Some(part) = UNBOUNDED_PARTS.iter().find(|p| **p == kind) {
                    return Err(unbounded(format!("a content part of type {part}")));
                }
                if IMAGE_PARTS.contains(&kind) {
                    *images += 1;
                }
            }
            o.values().try_for_each(|v| parts(v, images))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn worst(body: Value, api: Api) -> Result<Worst, Unbounded> {
        let bytes = body.to_string().len();
        read(&body, bytes, api)
    }

    fn field(body: Value, api: Api) -> String {
        worst(body, api).unwrap_err().field
    }

    #[test]
    fn pi_s_own_requests_are_bounded_by_their_limit() {
        let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "stream": true, "stream_options": {"include_usage": true}, "store": false,
            "max_completion_tokens": 4096, "tools": [{"type": "function", "function": {"name": "bash"}}],
            "reasoning_effort": "medium", "prompt_cache_key": "s"});
        let w = worst(chat.clone(), Api::OpenAiCompletions).unwrap();
        assert_eq!(w.output_tokens(Some(100)), Some(4096));
        assert_eq!(
            w.input,
            chat.to_string().len() as u64 + OVERHEAD_TOKENS,
            "one token a byte, and the overhead"
        );
        let responses = json!({"model": "m", "input": [], "stream": true, "store": false,
            "max_output_tokens": 900, "reasoning": {"effort": "high", "summary": "auto"},
            "include": ["reasoning.encrypted_content"],
            "tools": [{"type": "function", "name": "bash", "parameters": {}}]});
        let w = worst(responses, Api::OpenAiResponses).unwrap();
        assert_eq!(w.output_tokens(None), Some(900));
        let anthropic = json!({"model": "m", "messages": [], "max_tokens": 8000, "stream": true,
            "system": [{"type": "text", "text": "x"}], "thinking": {"type": "enabled", "budget_tokens": 4000},
            "tools": [{"name": "bash", "input_schema": {"type": "object"}}]});
        let w = worst(anthropic, Api::AnthropicMessages).unwrap();
        assert_eq!(w.output_tokens(None), Some(8000), "the budget is inside");
        // Without a limit of its own, the model's holds.
        let bare = json!({"model": "m", "messages": []});
        assert_eq!(
            worst(bare.clone(), Api::OpenAiCompletions)
                .unwrap()
                .output_tokens(Some(77)),
            Some(77)
        );
        assert_eq!(
            worst(bare, Api::OpenAiCompletions)
                .unwrap()
                .output_tokens(None),
            None
        );
    }

    #[test]
    fn every_field_that_multiplies_or_extends_the_output_counts() {
        let api = Api::OpenAiCompletions;
        // n answers, each up to its limit.
        let w = worst(json!({"model": "m", "max_tokens": 1, "n": 128}), api).unwrap();
        assert_eq!(w.output_tokens(Some(10)), Some(128));
        // The largest limit under any of its names.
        let w = worst(
            json!({"model": "m", "max_completion_tokens": 1, "max_tokens": 5000}),
            api,
        )
        .unwrap();
        assert_eq!(w.output_tokens(None), Some(5000));
        // A reasoning budget outside the limit is added to it.
        for budget in [
            json!({"model": "m", "max_tokens": 10, "thinking_budget": 990}),
            json!({"model": "m", "max_tokens": 10, "reasoning": {"max_tokens": 990}}),
            json!({"model": "m", "max_tokens": 10, "thinking": {"type": "enabled", "budget_tokens": 990}}),
        ] {
            assert_eq!(
                worst(budget.clone(), api).unwrap().output_tokens(None),
                Some(1000),
                "{budget}"
            );
        }
        // Anthropic's budget is inside max_tokens, but a larger one (interleaved thinking) counts.
        let w = worst(
            json!({"model": "m", "max_tokens": 10, "thinking": {"type": "enabled", "budget_tokens": 990}}),
            Api::AnthropicMessages,
        )
        .unwrap();
        assert_eq!(w.output_tokens(None), Some(990));
        // A limit that is not a whole number of tokens is not read as one.
        assert_eq!(
            field(json!({"model": "m", "max_tokens": 1.5}), api),
            "max_tokens"
        );
        assert_eq!(
            field(json!({"model": "m", "max_tokens": "9"}), api),
            "max_tokens"
        );
        assert_eq!(field(json!({"model": "m", "n": -2}), api), "n");
        // Huge numbers saturate rather than wrap.
        let w = worst(json!({"model": "m", "max_tokens": u64::MAX, "n": 3}), api).unwrap();
        assert_eq!(w.output_tokens(None), Some(u64::MAX));
    }

    #[test]
    fn a_field_of_unknown_cost_leaves_the_call_unbounded_and_is_named() {
        let chat = Api::OpenAiCompletions;
        for (body, named) in [
            (json!({"model": "m", "best_of": 50}), "best_of"),
            (
                json!({"model": "m", "web_search_options": {}}),
                "web_search_options",
            ),
            (json!({"model": "m", "audio": {"voice": "x"}}), "audio"),
            (
                json!({"model": "m", "prediction": {"type": "content"}}),
                "prediction",
            ),
            (json!({"model": "m", "plugins": [{"id": "web"}]}), "plugins"),
            (
                json!({"model": "m", "service_tier": "priority"}),
                "service_tier",
            ),
            (
                json!({"model": "m", "modalities": ["text", "audio"]}),
                "modalities",
            ),
            (
                json!({"model": "m", "reasoning": {"effort": "high", "budget": 9}}),
                "reasoning.budget",
            ),
            (
                json!({"model": "m", "tools": [{"type": "function"}, {"type": "web_search"}]}),
                "tools[1].type",
            ),
            (
                json!({"model": "m", "\u{1b}[31mx": 1}),
                "a field of an unusual name",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
                "a content part of type input_file",
            ),
        ] {
            assert_eq!(field(body.clone(), chat), named, "{body}");
        }
        let responses = Api::OpenAiResponses;
        for (body, named) in [
            (
                json!({"model": "m", "previous_response_id": "r"}),
                "previous_response_id",
            ),
            (json!({"model": "m", "conversation": "c"}), "conversation"),
            (json!({"model": "m", "prompt": {"id": "p"}}), "prompt"),
            (json!({"model": "m", "max_tool_calls": 3}), "max_tool_calls"),
            (
                json!({"model": "m", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (json!({"model": "m", "n": 2}), "n"),
            (
                json!({"model": "m", "input": [{"type": "item_reference", "id": "i"}]}),
                "a content part of type item_reference",
            ),
        ] {
            assert_eq!(field(body.clone(), responses), named, "{body}");
        }
        let anthropic = Api::AnthropicMessages;
        for (body, named) in [
            (json!({"model": "m", "mcp_servers": []}), "mcp_servers"),
            (json!({"model": "m", "container": "c"}), "container"),
            (
                json!({"model": "m", "fallbacks": [{"model": "x"}]}),
                "fallbacks",
            ),
            (
                json!({"model": "m", "thread": {"type": "continue", "previous_message_id": "x"}}),
                "thread",
            ),
            (
                json!({"model": "m", "service_tier": "auto"}),
                "service_tier",
            ),
            (
                json!({"model": "m", "output_config": {"effort": "high", "task_budget": 1}}),
                "output_config.task_budget",
            ),
            (
                json!({"model": "m", "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools[0].type",
            ),
            (json!({"model": "m", "n": 2}), "n"),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}),
                "a content part of type document",
            ),
        ] {
            assert_eq!(field(body.clone(), anthropic), named, "{body}");
        }
        assert_eq!(
            field(
                json!({"model": "m", "input": "x", "stream": true}),
                Api::OpenAiDecisions
            ),
            "stream"
        );
        assert!(worst(json!([1]), chat).is_err());
        // What passes: a thread begun here, the standard tier, a cheaper one.
        assert!(worst(json!({"model": "m", "thread": {"type": "create"}, "service_tier": "standard_only"}), anthropic).is_ok());
        assert!(worst(json!({"model": "m", "service_tier": "flex"}), responses).is_ok());
    }

    #[test]
    fn each_image_is_allowed_its_own_tokens_whatever_its_bytes() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]});
        let bytes = body.to_string().len() as u64;
        let w = worst(body, Api::OpenAiCompletions).unwrap();
        assert_eq!(w.input, bytes + 2 * IMAGE_TOKENS + OVERHEAD_TOKENS);
        // Tool schemas are not content: a schema's "type" is no part.
        let schema = json!({"model": "m", "tools": [{"type": "function", "function": {"parameters":
            {"type": "object", "properties": {"f": {"type": "file"}}}}}]});
        assert!(worst(schema, Api::OpenAiCompletions).is_ok());
    }
}
