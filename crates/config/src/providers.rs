//! The variables that hold each provider's key, as the pinned pi reads them: read off the built-in
//! catalog ([`crate::catalog`]), so that the reserved names and the job's key variable come from one
//! place that a test keeps equal to the installed pi.

use crate::catalog;

/// The key variables of `providers`, or of every provider pi knows when `None`, sorted.
pub fn key_variables(providers: Option<&[String]>) -> Vec<String> {
    let mut out: Vec<String> = catalog::builtin()
        .providers
        .iter()
        .filter(|p| providers.is_none_or(|list| list.contains(&p.id)))
        .flat_map(|p| p.key_variables.iter().cloned())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether pi reads `name` for the built-in `provider`'s key.
pub fn is_key_of(provider: &str, name: &str) -> bool {
    catalog::builtin_provider(provider).is_some_and(|p| p.key_variables.iter().any(|v| v == name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_narrows_the_reserved_keys_and_no_list_reserves_all() {
        let all = key_variables(None);
        assert!(all.iter().any(|v| v == "HF_TOKEN") && all.iter().any(|v| v == "OPENAI_API_KEY"));
        let some = key_variables(Some(&["openai".to_owned()]));
        assert_eq!(some, ["OPENAI_API_KEY"]);
        assert!(is_key_of("anthropic", "ANTHROPIC_API_KEY"));
        assert!(!is_key_of("openai", "ANTHROPIC_API_KEY"));
    }
}
