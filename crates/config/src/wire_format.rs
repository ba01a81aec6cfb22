//! The wire formats the model gateway reads, by pi-ai's names and by their request paths.

/// The wire formats the gateway reads: each one's requests name their model in the body and its
/// answers report their usage, streamed (server-sent events) or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI chat completions (`POST …/chat/completions`).
    OpenAiCompletions,
    /// OpenAI responses (`POST …/responses`).
    OpenAiResponses,
    /// Anthropic messages (`POST …/v1/messages`).
    AnthropicMessages,
    /// OpenAI's classifier API (`POST …/decisions`).
    OpenAiDecisions,
    /// TypeSafe's System One classifier API, as OpenRouter, Vercel and others serve it
    /// (`POST …/systemone`).
    SystemOne,
    /// OpenRouter's image models, over chat completions (`POST …/chat/completions`, not streamed).
    OpenRouterImages,
}

impl Api {
    /// pi-ai's name for the wire format, when the gateway reads it.
    pub fn parse(api: &str) -> Option<Api> {
        match api {
            "openai-completions" => Some(Api::OpenAiCompletions),
            "openai-responses" => Some(Api::OpenAiResponses),
            "anthropic-messages" => Some(Api::AnthropicMessages),
            "openai-decisions" => Some(Api::OpenAiDecisions),
            "typesafe-system-one" => Some(Api::SystemOne),
            "openrouter-images" => Some(Api::OpenRouterImages),
            _ => None,
        }
    }

    /// The wire formats a request path (after the provider's base URL) can be.
    pub fn for_path(path: &str) -> &'static [Api] {
        if path.ends_with("/chat/completions") {
            &[Api::OpenAiCompletions, Api::OpenRouterImages]
        } else if path.ends_with("/responses") {
            &[Api::OpenAiResponses]
        } else if path.ends_with("/messages") {
            &[Api::AnthropicMessages]
        } else if path.ends_with("/decisions") {
            &[Api::OpenAiDecisions]
        } else if path.ends_with("/systemone") {
            &[Api::SystemOne]
        } else {
            &[]
        }
    }
}
