//! What a provider's answer says it used, read as the answer passes through the gateway: a JSON
//! body, or an event stream (server-sent events) read event by event. Pure: bytes in, tokens out.
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

use serde_json::Value;

use super::rules::{Api, Tokens};

/// The most of a JSON answer kept to read its usage (an image model's answer carries its images).
pub const MAX_JSON_BODY: usize = 64 * 1024 * 1024;
/// The most of one event kept (an event longer than this is skipped).
const MAX_EVENT: usize = 16 * 1024 * 1024;

/// Reads one answer's usage as its bytes pass.
#[derive(Debug)]
pub struct UsageReader {
    api: Api,
    stream: bool,
    /// A JSON body so far, or the part of the stream after the last full line.
    buf: Vec<u8>,
    /// The `data:` lines of the event being read.
    data: Vec<u8>,
    too_long: bool,
    usage: Option<Tokens>,
}

impl UsageReader {
    /// `stream`: the answer is an event stream (`text/event-stream`), else a JSON body.
    pub fn new(api: Api, stream: bool) -> UsageReader {
        UsageReader {
            api,
            stream,
            buf: Vec::new(),
            data: Vec::new(),
            too_long: false,
            usage: None,
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

    /// The usage the answer reported, once it has ended.
    pub fn finish(mut self) -> Option<Tokens> {
        if !self.stream {
            if self.too_long {
                return None;
            }
            let body: Value = serde_json::from_slice(&self.buf).ok()?;
            return body.get("usage").and_then(|u| read_usage(self.api, u));
        }
        if !self.buf.is_empty() {
            let line = std::mem::take(&mut self.buf);
            self.line(&line);
        }
        self.dispatch();
        self.usage
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
                if let Some(usage) = event.pointer("/response/usage").filter(|_| ended) {
                    self.usage = read_usage(self.api, usage).or(self.usage);
                }
            }
            _ => {
                if let Some(usage) = event.get("usage").filter(|u| u.is_object()) {
                    self.usage = read_usage(self.api, usage).or(self.usage);
                }
            }
        }
    }

    fn anthropic_event(&mut self, event: &Value) {
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                if let Some(usage) = event.pointer("/message/usage") {
                    self.usage = read_usage(Api::AnthropicMessages, usage);
                }
            }
            Some("message_delta") => {
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
                input: prompt.saturating_sub(cache_read + cache_write),
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
        let mut reader = UsageReader::new(api, stream);
        for piece in text.as_bytes().chunks(size) {
            reader.feed(piece);
        }
        reader.finish()
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
}
