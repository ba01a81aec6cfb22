//! The variables that hold each provider's key, as the pinned pi (1.6.0) reads them
//! (`@earendil-works/pi-ai`, each provider's `envApiKeyAuth`; see docs/pi-facts.md).

/// `(provider, key variables)`.
pub const PROVIDER_KEYS: &[(&str, &[&str])] = &[
    (
        "anthropic",
        &[
            "ANTHROPIC_AUTH_TOKEN",
            "ANTHROPIC_OAUTH_TOKEN",
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_FEDERATION_RULE_ID",
            "ANTHROPIC_ORGANIZATION_ID",
            "ANTHROPIC_IDENTITY_TOKEN_FILE",
            "ANTHROPIC_SERVICE_ACCOUNT_ID",
            "ANTHROPIC_WORKSPACE_ID",
        ],
    ),
    ("github-copilot", &["COPILOT_GITHUB_TOKEN"]),
    ("ant-ling", &["ANT_LING_API_KEY"]),
    (
        "qwen-token-plan",
        &["QWEN_TOKEN_PLAN_TEAM_API_KEY", "QWEN_TOKEN_PLAN_API_KEY"],
    ),
    (
        "qwen-token-plan-cn",
        &[
            "QWEN_TOKEN_PLAN_TEAM_CN_API_KEY",
            "QWEN_TOKEN_PLAN_CN_API_KEY",
        ],
    ),
    (
        "qwen-token-plan-individual",
        &[
            "QWEN_TOKEN_PLAN_INDIVIDUAL_API_KEY",
            "QWEN_TOKEN_PLAN_API_KEY",
        ],
    ),
    (
        "qwen-token-plan-individual-cn",
        &[
            "QWEN_TOKEN_PLAN_INDIVIDUAL_CN_API_KEY",
            "QWEN_TOKEN_PLAN_CN_API_KEY",
        ],
    ),
    ("openai", &["OPENAI_API_KEY"]),
    ("azure", &["AZURE_OPENAI_API_KEY"]),
    ("nvidia", &["NVIDIA_API_KEY"]),
    ("deepseek", &["DEEPSEEK_API_KEY"]),
    ("google", &["GEMINI_API_KEY"]),
    (
        "google-vertex",
        &["GOOGLE_CLOUD_API_KEY", "GOOGLE_APPLICATION_CREDENTIALS"],
    ),
    (
        "amazon-bedrock",
        &[
            "AWS_BEARER_TOKEN_BEDROCK",
            "AWS_PROFILE",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
        ],
    ),
    ("groq", &["GROQ_API_KEY"]),
    ("cerebras", &["CEREBRAS_API_KEY"]),
    ("xai", &["XAI_API_KEY"]),
    ("typesafe", &["TYPESAFE_API_KEY"]),
    ("radius", &["RADIUS_API_KEY"]),
    ("openrouter", &["OPENROUTER_API_KEY"]),
    ("vercel-ai-gateway", &["AI_GATEWAY_API_KEY"]),
    ("zai", &["ZAI_API_KEY"]),
    ("zai-coding-cn", &["ZAI_CODING_CN_API_KEY"]),
    ("mistral", &["MISTRAL_API_KEY"]),
    ("minimax", &["MINIMAX_API_KEY"]),
    ("minimax-cn", &["MINIMAX_CN_API_KEY"]),
    ("moonshotai", &["MOONSHOT_API_KEY"]),
    ("moonshotai-cn", &["MOONSHOT_API_KEY"]),
    ("huggingface", &["HF_TOKEN"]),
    ("fireworks", &["FIREWORKS_API_KEY"]),
    ("together", &["TOGETHER_API_KEY"]),
    ("baseten", &["BASETEN_API_KEY"]),
    ("opencode", &["OPENCODE_API_KEY"]),
    ("opencode-go", &["OPENCODE_API_KEY"]),
    ("kimi-coding", &["KIMI_API_KEY"]),
    ("meta", &["META_API_KEY"]),
    (
        "cloudflare-workers-ai",
        &["CLOUDFLARE_API_KEY", "CLOUDFLARE_ACCOUNT_ID"],
    ),
    (
        "cloudflare-ai-gateway",
        &[
            "CLOUDFLARE_API_KEY",
            "CLOUDFLARE_ACCOUNT_ID",
            "CLOUDFLARE_GATEWAY_ID",
        ],
    ),
    ("xiaomi", &["XIAOMI_API_KEY"]),
    ("xiaomi-token-plan-cn", &["XIAOMI_TOKEN_PLAN_CN_API_KEY"]),
    ("xiaomi-token-plan-ams", &["XIAOMI_TOKEN_PLAN_AMS_API_KEY"]),
    ("xiaomi-token-plan-sgp", &["XIAOMI_TOKEN_PLAN_SGP_API_KEY"]),
    ("openai-codex", &[]),
];

/// The key variables of `providers`, or of every provider pi knows when `None`.
pub fn key_variables(providers: Option<&[String]>) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = PROVIDER_KEYS
        .iter()
        .filter(|(p, _)| providers.is_none_or(|list| list.iter().any(|l| l == p)))
        .flat_map(|(_, vars)| vars.iter().copied())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_narrows_the_reserved_keys_and_no_list_reserves_all() {
        let all = key_variables(None);
        assert!(all.contains(&"HF_TOKEN") && all.contains(&"OPENAI_API_KEY"));
        let some = key_variables(Some(&["openai".to_owned()]));
        assert_eq!(some, ["OPENAI_API_KEY"]);
        assert!(!some.contains(&"HF_TOKEN"));
    }
}
