//! What a provider's answer says, read as the answer passes through the gateway: a JSON body, or
//! an event stream (server-sent events) read event by event. Pure: bytes in; the tokens it used
//! and, for a chat answer, how it ended and its text out. The ending and the text are read as pi-ai
//! reads them (its `mapStopReason` of each wire format), so that where pi's account of an answer
//! is honest it agrees with the gateway's.
//!
//! Where each wire format reports usage (and how pi-ai reads it, which this follows):
//!
//! - OpenAI chat completions and OpenRouter's images: `usage` of the body, or of the stream's last
//!   chunk (`stream_options.include_usage`); `prompt_tokens` holds the cache's reads
//!   (`prompt_tokens_details.cached_tokens`) and writes, which are counted apart.
//! - OpenAI responses: `usage` of the body, or of the `response.completed` event's response;
//!   `input_tokens` holds `input_tokens_details.cached_tokens`.
//! - Anthropic messages: `usage` of the body, or `message_start`'s message and then each
//!   `message_delta`, whose counts replace the earlier ones; input and the cache are apart.
//! - The classifier APIs: `usage` of the body, `input_tokens` and `output_tokens`.

use protocol::exit_line::push_bounded;
use protocol::model_answer::Ending;
use serde_json::Value;

use super::rules::{Api, Tokens};

/// The most of a JSON answer kept to read its usage (an image model's answer carries its images).
pub const MAX_JSON_BODY: usize = 64 * 1024 * 1024;
/// The most of one event kept (an event longer than this is skipped).
const MAX_EVENT: usize = 16 * 1024 * 1024;

/// What one answer said, once read to its end.
#[derive(Debug, Default, PartialEq)]
pub struct Read {
    pub usage: Option<Tokens>,
    /// How a chat answer ended; `None` when it did not say (or is no chat answer).
    pub ending: Option<Ending>,
    /// A chat answer's text parts, joined by line ends, bounded.
    pub text: String,
    pub cut: bool,
}

/// Reads one answer as its bytes pass.
#[derive(Debug)]
pub struct AnswerReader {
    api: Api,
    stream: bool,
    /// A JSON body so far, or the part of the stream after the last full line.
    buf: Vec<u8>,
    /// The `data:` lines of the event being read.
    data: Vec<u8>,
    too_long: bool,
    usage: Option<Tokens>,
    ending: Option<Ending>,
    text: String,
    cut: bool,
    /// A tool call was part of the answer.
    tool_call: bool,
    /// A chat completions stream gave `finish_reason`.
    finished: bool,
    /// A chat completions stream gave a chunk.
    chunks: bool,
}

impl AnswerReader {
    /// `stream`: the answer is an event stream (`text/event-stream`), else a JSON body.
    pub fn new(api: Api, stream: bool) -> AnswerReader {
        AnswerReader {
            api,
            stream,
            buf: Vec::new(),
            data: Vec::new(),
            too_long: false,
            usage: None,
            ending: None,
            text: String::new(),
            cut: false,
            tool_call: false,
            finished: false,
            chunks: false,
        }
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        if !self.stream {
            if self.buf.len() + bytes.len() <= MAX_JSON_BODY {
                self.buf.extend_from_slice(bytes);
            } else {
                self.too_long = true;
            }
            return;
        }
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(end) = self.buf[start..].iter().position(|b| *b == b'\n') {
            let line = self.buf[start..start + end].to_vec();
            start += end + 1;
            self.line(&line);
        }
        self.buf.drain(..start);
        if self.buf.len() > MAX_EVENT {
            self.buf.clear();
            self.too_long = true;
        }
    }

    /// What the answer said, once it has ended.
    pub fn finish(mut self) -> Read {
        if !self.stream {
            let body: Option<Value> = (!self.too_long)
                .then(|| serde_json::from_slice(&self.buf).ok())
                .flatten();
            if let Some(body) = body {
                self.usage = body.get("usage").and_then(|u| read_usage(self.api, u));
                self.whole_answer(&body);
            }
        } else {
            if !self.buf.is_empty() {
                let line = std::mem::take(&mut self.buf);
                self.line(&line);
            }
            self.dispatch();
            // pi-ai's reading of a chat completions stream that never gave `finish_reason`.
            if self.api == Api::OpenAiCompletions && self.chunks && !self.finished {
                self.ending = Some(self.tool_or(Ending::Stop));
            }
        }
        Read {
            usage: self.usage,
            ending: self.ending,
            text: self.text,
            cut: self.cut,
        }
    }

    fn push_text(&mut self, piece: &str) {
        push_bounded(&mut self.text, &mut self.cut, piece);
    }

    /// A new text part: apart from the one before by a line end, as pi joins them.
    fn new_part(&mut self) {
        if !self.text.is_empty() {
            self.push_text("\n");
        }
    }

    /// The text of each part of `parts` (a list) whose `type` is `kind`, each a part of its own.
    fn text_parts(&mut self, parts: Option<&Value>, kind: &str) {
        for part in parts.and_then(Value::as_array).into_iter().flatten() {
            if part.get("type").and_then(Value::as_str) == Some(kind)
                && let Some(t) = part.get("text").and_then(Value::as_str)
            {
                self.new_part();
                self.push_text(t);
            }
        }
    }

    /// `ending`, or `ToolUse` when the answer called a tool and `ending` is a normal stop.
    fn tool_or(&self, ending: Ending) -> Ending {
        match ending {
            Ending::Stop if self.tool_call => Ending::ToolUse,
            other => other,
        }
    }

    /// A JSON answer (or a responses stream's last response): its text and ending.
    fn whole_answer(&mut self, body: &Value) {
        match self.api {
            Api::OpenAiCompletions => {
                let Some(choice) = body.pointer("/choices/0") else {
                    return;
                };
                if let Some(text) = choice.pointer("/message/content").and_then(Value::as_str) {
                    self.push_text(text);
                }
                self.ending = Some(completions_ending(
                    choice.get("finish_reason").and_then(Value::as_str),
                ));
            }
            Api::AnthropicMessages => {
                self.text_parts(body.get("content"), "text");
                self.ending = anthropic_ending(body.get("stop_reason").and_then(Value::as_str));
            }
            Api::OpenAiResponses => {
                for item in body
                    .get("output")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    match item.get("type").and_then(Value::as_str) {
                        Some("message") => self.text_parts(item.get("content"), "output_text"),
                        Some("function_call" | "custom_tool_call") => self.tool_call = true,
                        _ => {}
                    }
                }
                let ending = responses_ending(
                    body.get("status").and_then(Value::as_str),
                    body.pointer("/incomplete_details/reason")
                        .and_then(Value::as_str),
                );
                self.ending = Some(self.tool_or(ending));
            }
            // Classifiers and images: no chat answer.
            _ => {}
        }
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch();
        } else if let Some(data) = line.strip_prefix(b"data:") {
            let data = data.strip_prefix(b" ").unwrap_or(data);
            if !self.data.is_empty() {
                self.data.push(b'\n');
            }
            if self.data.len() + data.len() <= MAX_EVENT {
                self.data.extend_from_slice(data);
            } else {
                self.too_long = true;
            }
        }
        // `event:`, `id:`, `retry:` and comments say nothing of usage.
    }

    /// One whole event: its data, when it is JSON, may carry usage.
    fn dispatch(&mut self) {
        let data = std::mem::take(&mut self.data);
        if std::mem::take(&mut self.too_long) || data.is_empty() || data == b"[DONE]" {
            return;
        }
        let Ok(event) = serde_json::from_slice::<Value>(&data) else {
            return;
        };
        match self.api {
            Api::AnthropicMessages => self.anthropic_event(&event),
            Api::OpenAiResponses => {
                let ended = matches!(
                    event.get("type").and_then(Value::as_str),
                    Some("response.completed" | "response.incomplete" | "response.failed")
                );
                if ended && let Some(response) = event.get("response") {
                    if let Some(usage) = response.get("usage") {
                        self.usage = read_usage(self.api, usage).or(self.usage);
                    }
                    self.text.clear();
                    self.cut = false;
                    self.whole_answer(response);
                }
            }
            Api::OpenAiCompletions => {
                if let Some(usage) = event.get("usage").filter(|u| u.is_object()) {
                    self.usage = read_usage(self.api, usage).or(self.usage);
                }
                self.completions_chunk(&event);
            }
            _ => {
                if let Some(usage) = event.get("usage").filter(|u| u.is_object()) {
                    self.usage = read_usage(self.api, usage).or(self.usage);
                }
            }
        }
    }

    /// One chunk of a chat completions stream: its text, its tool calls, its `finish_reason`.
    fn completions_chunk(&mut self, event: &Value) {
        let Some(choice) = event.pointer("/choices/0") else {
            return;
        };
        self.chunks = true;
        if let Some(text) = choice.pointer("/delta/content").and_then(Value::as_str) {
            self.push_text(text);
        }
        if choice
            .pointer("/delta/tool_calls")
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty())
        {
            self.tool_call = true;
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finished = true;
            self.ending = Some(completions_ending(Some(reason)));
        }
    }

    fn anthropic_event(&mut self, event: &Value) {
        match event.get("type").and_then(Value::as_str) {
            Some("content_block_start")
                if event.pointer("/content_block/type").and_then(Value::as_str) == Some("text") =>
            {
                self.new_part();
                if let Some(t) = event.pointer("/content_block/text").and_then(Value::as_str) {
                    self.push_text(t);
                }
            }
            Some("content_block_delta") => {
                if event.pointer("/delta/type").and_then(Value::as_str) == Some("text_delta")
                    && let Some(t) = event.pointer("/delta/text").and_then(Value::as_str)
                {
                    self.push_text(t);
                }
            }
            Some("error") => self.ending = Some(Ending::Other),
            Some("message_start") => {
                if let Some(usage) = event.pointer("/message/usage") {
                    self.usage = read_usage(Api::AnthropicMessages, usage);
                }
            }
            Some("message_delta") => {
                if let Some(reason) = event.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.ending = anthropic_ending(Some(reason));
                }
                let Some(usage) = event.get("usage") else {
                    return;
                };
                // Each count the delta gives replaces the one before (proxies leave some out).
                let mut tokens = self.usage.unwrap_or_default();
                let set = |slot: &mut u64, key: &str| {
                    if let Some(n) = usage.get(key).and_then(Value::as_u64) {
                        *slot = n;
                    }
                };
                set(&mut tokens.input, "input_tokens");
                set(&mut tokens.output, "output_tokens");
                set(&mut tokens.cache_read, "cache_read_input_tokens");
                set(&mut tokens.cache_write, "cache_creation_input_tokens");
                self.usage = Some(tokens);
            }
            _ => {}
        }
    }
}

/// A chat completion's `finish_reason`, as pi-ai maps it (none is a normal stop).
fn completions_ending(reason: Option<&str>) -> Ending {
    match reason {
        None | Some("stop" | "end") => Ending::Stop,
        Some("length") => Ending::Length,
        Some("tool_calls" | "function_call") => Ending::ToolUse,
        Some(_) => Ending::Other,
    }
}

/// An Anthropic message's `stop_reason`, as pi-ai maps it.
fn anthropic_ending(reason: Option<&str>) -> Option<Ending> {
    Some(match reason? {
        "end_turn" | "pause_turn" | "stop_sequence" => Ending::Stop,
        "max_tokens" => Ending::Length,
        "tool_use" => Ending::ToolUse,
        _ => Ending::Other,
    })
}

/// An OpenAI response's `status`, as pi-ai maps it (a tool call turns a stop into a tool use).
fn responses_ending(status: Option<&str>, incomplete: Option<&str>) -> Ending {
    match status {
        None | Some("completed" | "in_progress" | "queued") => Ending::Stop,
        Some("incomplete") if incomplete == Some("max_output_tokens") => Ending::Length,
        Some(_) => Ending::Other,
    }
}

/// A `usage` object in the shape of `api`.
pub fn read_usage(api: Api, usage: &Value) -> Option<Tokens> {
    let n = |path: &str| usage.pointer(path).and_then(Value::as_u64);
    if !usage.is_object() {
        return None;
    }
    match api {
        Api::OpenAiCompletions | Api::OpenRouterImages => {
            let prompt = n("/prompt_tokens").unwrap_or(0);
            let cache_read = n("/prompt_tokens_details/cached_tokens")
                .or_else(|| n("/prompt_cache_hit_tokens"))
                .or_else(|| n("/cached_tokens"))
                .unwrap_or(0);
            let cache_write = n("/prompt_tokens_details/cache_write_tokens").unwrap_or(0);
            Some(Tokens {
                input: prompt.saturating_sub(cache_read.saturating_add(cache_write)),
                output: n("/completion_tokens").unwrap_or(0),
                cache_read,
                cache_write,
            })
        }
        Api::OpenAiResponses => {
            let cache_read = n("/input_tokens_details/cached_tokens").unwrap_or(0);
            Some(Tokens {
                input: n("/input_tokens").unwrap_or(0).saturating_sub(cache_read),
                output: n("/output_tokens").unwrap_or(0),
                cache_read,
                cache_write: 0,
            })
        }
        Api::AnthropicMessages => Some(Tokens {
            input: n("/input_tokens").unwrap_or(0),
            output: n("/output_tokens").unwrap_or(0),
            cache_read: n("/cache_read_input_tokens").unwrap_or(0),
            cache_write: n("/cache_creation_input_tokens").unwrap_or(0),
        }),
        Api::OpenAiDecisions | Api::SystemOne => {
            if n("/input_tokens").is_none() && n("/output_tokens").is_none() {
                return None;
            }
            Some(Tokens {
                input: n("/input_tokens").unwrap_or(0),
                output: n("/output_tokens").unwrap_or(0),
                ..Tokens::default()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Feeds `text` in pieces of `size` bytes, as a network would cut it.
    fn read(api: Api, stream: bool, text: &str, size: usize) -> Option<Tokens> {
        answer(api, stream, text, size).usage
    }

    fn answer(api: Api, stream: bool, text: &str, size: usize) -> Read {
        let mut reader = AnswerReader::new(api, stream);
        for piece in text.as_bytes().chunks(size) {
            reader.feed(piece);
        }
        reader.finish()
    }

    fn sse(events: &[Value]) -> String {
        events.iter().map(|e| format!("data: {e}\n\n")).collect()
    }

    fn tokens(input: u64, output: u64, cache_read: u64, cache_write: u64) -> Option<Tokens> {
        Some(Tokens {
            input,
            output,
            cache_read,
            cache_write,
        })
    }

    #[test]
    fn openai_chat_completions_json_and_streamed() {
        let body = json!({"id": "c", "choices": [], "usage": {"prompt_tokens": 120, "completion_tokens": 30,
            "total_tokens": 150, "prompt_tokens_details": {"cached_tokens": 20}}})
        .to_string();
        assert_eq!(
            read(Api::OpenAiCompletions, false, &body, 7),
            tokens(100, 30, 20, 0)
        );
        let stream = [
            json!({"choices": [{"delta": {"content": "hi"}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": null}),
            json!({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 20}}),
        ]
        .iter()
        .map(|c| format!("data: {c}\r\n\r\n"))
        .collect::<String>()
            + "data: [DONE]\n\n";
        for size in [1, 5, 64, 4096] {
            assert_eq!(
                read(Api::OpenAiCompletions, true, &stream, size),
                tokens(100, 20, 0, 0)
            );
        }
        // A stream cut before its usage chunk reports none.
        let cut = &stream[..stream.find("\"prompt_tokens\"").unwrap()];
        assert_eq!(read(Api::OpenAiCompletions, true, cut, 16), None);
    }

    #[test]
    fn openai_chat_cache_fields_of_other_providers() {
        let deepseek =
            json!({"prompt_tokens": 50, "completion_tokens": 1, "prompt_cache_hit_tokens": 10});
        assert_eq!(
            read_usage(Api::OpenAiCompletions, &deepseek),
            tokens(40, 1, 10, 0)
        );
        let openrouter = json!({"prompt_tokens": 50, "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 10, "cache_write_tokens": 5}});
        assert_eq!(
            read_usage(Api::OpenAiCompletions, &openrouter),
            tokens(35, 1, 10, 5)
        );
        assert_eq!(read_usage(Api::OpenAiCompletions, &json!(7)), None);
    }

    #[test]
    fn anthropic_messages_json_and_streamed() {
        let body = json!({"type": "message", "content": [], "usage": {"input_tokens": 12, "output_tokens": 40,
            "cache_read_input_tokens": 100, "cache_creation_input_tokens": 8}})
        .to_string();
        assert_eq!(
            read(Api::AnthropicMessages, false, &body, 3),
            tokens(12, 40, 100, 8)
        );
        let events = [
            (
                "message_start",
                json!({"type": "message_start", "message": {"usage": {"input_tokens": 12,
                "output_tokens": 1, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 8}}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "delta": {"text": "hi"}}),
            ),
            (
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 40}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ];
        let stream: String = events
            .iter()
            .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
            .collect();
        for size in [1, 9, 1000] {
            assert_eq!(
                read(Api::AnthropicMessages, true, &stream, size),
                tokens(12, 40, 100, 8)
            );
        }
        // Without the delta, what message_start said.
        let start_only: String = events[..1]
            .iter()
            .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
            .collect();
        assert_eq!(
            read(Api::AnthropicMessages, true, &start_only, 4),
            tokens(12, 1, 100, 8)
        );
    }

    #[test]
    fn openai_responses_json_and_streamed() {
        let usage = json!({"input_tokens": 300, "input_tokens_details": {"cached_tokens": 100},
            "output_tokens": 50, "total_tokens": 350});
        let body = json!({"id": "r", "output": [], "usage": usage}).to_string();
        assert_eq!(
            read(Api::OpenAiResponses, false, &body, 10),
            tokens(200, 50, 100, 0)
        );
        let stream = format!(
            "event: response.created\ndata: {}\n\nevent: response.completed\ndata: {}\n\n",
            json!({"type": "response.created", "response": {"usage": null}}),
            json!({"type": "response.completed", "response": {"usage": usage}})
        );
        assert_eq!(
            read(Api::OpenAiResponses, true, &stream, 11),
            tokens(200, 50, 100, 0)
        );
    }

    #[test]
    fn classifiers_and_images() {
        let body =
            json!({"answers": [], "usage": {"input_tokens": 33, "output_tokens": 0}}).to_string();
        assert_eq!(
            read(Api::OpenAiDecisions, false, &body, 5),
            tokens(33, 0, 0, 0)
        );
        assert_eq!(read(Api::SystemOne, false, &body, 500), tokens(33, 0, 0, 0));
        let none = json!({"answers": [], "usage": {}}).to_string();
        assert_eq!(read(Api::SystemOne, false, &none, 500), None);
        let image = json!({"choices": [{"message": {"images": [{"image_url": {"url": "data:image/png;base64,AAAA"}}]}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 1290}})
        .to_string();
        assert_eq!(
            read(Api::OpenRouterImages, false, &image, 2),
            tokens(9, 1290, 0, 0)
        );
    }

    /// Found by the `gateway_stream` fuzz target: cache counts that add past u64.
    #[test]
    fn cache_counts_past_u64_do_not_overflow() {
        let usage = json!({"prompt_tokens": 5, "prompt_tokens_details":
            {"cached_tokens": u64::MAX, "cache_write_tokens": 2}});
        let tokens = read_usage(Api::OpenAiCompletions, &usage).unwrap();
        assert_eq!((tokens.input, tokens.cache_read), (0, u64::MAX));
    }

    #[test]
    fn what_cannot_be_read_reports_nothing() {
        assert_eq!(read(Api::OpenAiCompletions, false, "not json", 3), None);
        assert_eq!(
            read(Api::OpenAiCompletions, false, "{\"usage\": 1}", 3),
            None
        );
        assert_eq!(
            read(Api::OpenAiCompletions, true, "data: {nope\n\n", 3),
            None
        );
        // Data over several lines is one event.
        let split =
            "data: {\"usage\":\ndata: {\"prompt_tokens\": 4, \"completion_tokens\": 2}}\n\n";
        assert_eq!(
            read(Api::OpenAiCompletions, true, split, 6),
            tokens(4, 2, 0, 0)
        );
        // The last event needs no blank line after it.
        let last = "data: {\"usage\": {\"prompt_tokens\": 4, \"completion_tokens\": 2}}";
        assert_eq!(
            read(Api::OpenAiCompletions, true, last, 6),
            tokens(4, 2, 0, 0)
        );
    }

    #[test]
    fn chat_completions_endings_and_text() {
        let text = sse(&[
            json!({"choices": [{"delta": {"role": "assistant", "content": "All "}}]}),
            json!({"choices": [{"delta": {"content": "done."}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "stop"}]}),
        ]) + "data: [DONE]\n\n";
        for size in [1, 7, 4096] {
            let read = answer(Api::OpenAiCompletions, true, &text, size);
            assert_eq!(read.ending, Some(Ending::Stop));
            assert_eq!(read.text, "All done.");
        }
        let tool = sse(&[
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "bash", "arguments": "{}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
        assert_eq!(
            answer(Api::OpenAiCompletions, true, &tool, 9).ending,
            Some(Ending::ToolUse)
        );
        // No finish_reason: as pi-ai reads it, by whether a tool was called.
        let unsaid = sse(&[json!({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]})]);
        assert_eq!(
            answer(Api::OpenAiCompletions, true, &unsaid, 9).ending,
            Some(Ending::ToolUse)
        );
        let length = sse(&[json!({"choices": [{"delta": {}, "finish_reason": "length"}]})]);
        assert_eq!(
            answer(Api::OpenAiCompletions, true, &length, 9).ending,
            Some(Ending::Length)
        );
        let filtered =
            sse(&[json!({"choices": [{"delta": {}, "finish_reason": "content_filter"}]})]);
        assert_eq!(
            answer(Api::OpenAiCompletions, true, &filtered, 9).ending,
            Some(Ending::Other)
        );
        let body = json!({"choices": [{"message": {"content": "Fine."}, "finish_reason": "stop"}]})
            .to_string();
        let read = answer(Api::OpenAiCompletions, false, &body, 3);
        assert_eq!(
            (read.ending, read.text.as_str()),
            (Some(Ending::Stop), "Fine.")
        );
        // A stream that says nothing: no ending.
        assert_eq!(answer(Api::OpenAiCompletions, true, "", 1).ending, None);
    }

    #[test]
    fn anthropic_endings_and_text() {
        let events = [
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "One."}}),
            json!({"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": "Two."}}),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}),
            json!({"type": "message_stop"}),
        ];
        let read = answer(Api::AnthropicMessages, true, &sse(&events), 5);
        assert_eq!(read.ending, Some(Ending::Stop));
        assert_eq!(read.text, "One.\nTwo.");
        for (reason, ending) in [
            ("tool_use", Ending::ToolUse),
            ("max_tokens", Ending::Length),
            ("refusal", Ending::Other),
            ("pause_turn", Ending::Stop),
        ] {
            let delta = sse(&[json!({"type": "message_delta", "delta": {"stop_reason": reason}})]);
            assert_eq!(
                answer(Api::AnthropicMessages, true, &delta, 4).ending,
                Some(ending)
            );
        }
        let body =
            json!({"content": [{"type": "text", "text": "A"}, {"type": "tool_use", "name": "x"}],
            "stop_reason": "tool_use"})
            .to_string();
        let read = answer(Api::AnthropicMessages, false, &body, 8);
        assert_eq!(
            (read.ending, read.text.as_str()),
            (Some(Ending::ToolUse), "A")
        );
    }

    #[test]
    fn responses_endings_and_text() {
        let response = |status: &str, output: Value| {
            json!({"type": "response.completed", "response": {"status": status, "output": output,
                "incomplete_details": {"reason": "max_output_tokens"}}})
        };
        let message = json!([{"type": "reasoning"}, {"type": "message", "content": [{"type": "output_text", "text": "Done."}]}]);
        let stream = sse(&[
            json!({"type": "response.output_text.delta", "delta": "Do"}),
            response("completed", message.clone()),
        ]);
        let read = answer(Api::OpenAiResponses, true, &stream, 6);
        assert_eq!(
            (read.ending, read.text.as_str()),
            (Some(Ending::Stop), "Done.")
        );
        let called = json!([{"type": "function_call", "name": "bash"}]);
        let stream = sse(&[response("completed", called)]);
        assert_eq!(
            answer(Api::OpenAiResponses, true, &stream, 6).ending,
            Some(Ending::ToolUse)
        );
        let stream = sse(&[response("incomplete", message.clone())]);
        assert_eq!(
            answer(Api::OpenAiResponses, true, &stream, 6).ending,
            Some(Ending::Length)
        );
        let body = json!({"status": "failed", "output": message}).to_string();
        assert_eq!(
            answer(Api::OpenAiResponses, false, &body, 6).ending,
            Some(Ending::Other)
        );
    }

    #[test]
    fn a_long_answer_is_cut() {
        let long = "x".repeat(protocol::exit_line::MAX_FINAL_MESSAGE + 10);
        let body = json!({"choices": [{"message": {"content": long}, "finish_reason": "stop"}]})
            .to_string();
        let read = answer(Api::OpenAiCompletions, false, &body, 4096);
        assert!(read.cut);
        assert_eq!(read.text.len(), protocol::exit_line::MAX_FINAL_MESSAGE);
    }
}
