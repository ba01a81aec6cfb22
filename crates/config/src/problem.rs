//! Why a server entry is refused: a stable code, the field it concerns, and a message that names the
//! field and never the value written there.

use std::fmt;

/// The stable codes of server problems, as `mcp check --json` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProblemCode {
    EntryNotObject,
    NameInvalid,
    NameReserved,
    KeyAuth,
    KeyCwd,
    KeyUnknown,
    KeyOtherTransport,
    DescriptionMissing,
    DescriptionInvalid,
    TransportMissing,
    TransportConflict,
    TypeSse,
    TypeInvalid,
    TypeMismatch,
    UrlInvalid,
    UrlScheme,
    UrlNotPlain,
    UrlCredentials,
    UrlFragment,
    UrlHostReference,
    UrlQueryLiteral,
    ReferenceMalformed,
    HeaderInvalid,
    HeaderReserved,
    HeaderLiteral,
    EnvInvalid,
    EnvReserved,
    EnvLiteral,
    CommandInvalid,
    CommandPath,
    CommandHome,
    ArgumentInvalid,
    ArgumentHome,
    PackageRunner,
    ExposureInvalid,
    ToolExposureInvalid,
    TimeoutInvalid,
    EnabledInvalid,
    AllowPackageRunnerInvalid,
}

impl ProblemCode {
    pub const ALL: [ProblemCode; 39] = [
        ProblemCode::EntryNotObject,
        ProblemCode::NameInvalid,
        ProblemCode::NameReserved,
        ProblemCode::KeyAuth,
        ProblemCode::KeyCwd,
        ProblemCode::KeyUnknown,
        ProblemCode::KeyOtherTransport,
        ProblemCode::DescriptionMissing,
        ProblemCode::DescriptionInvalid,
        ProblemCode::TransportMissing,
        ProblemCode::TransportConflict,
        ProblemCode::TypeSse,
        ProblemCode::TypeInvalid,
        ProblemCode::TypeMismatch,
        ProblemCode::UrlInvalid,
        ProblemCode::UrlScheme,
        ProblemCode::UrlNotPlain,
        ProblemCode::UrlCredentials,
        ProblemCode::UrlFragment,
        ProblemCode::UrlHostReference,
        ProblemCode::UrlQueryLiteral,
        ProblemCode::ReferenceMalformed,
        ProblemCode::HeaderInvalid,
        ProblemCode::HeaderReserved,
        ProblemCode::HeaderLiteral,
        ProblemCode::EnvInvalid,
        ProblemCode::EnvReserved,
        ProblemCode::EnvLiteral,
        ProblemCode::CommandInvalid,
        ProblemCode::CommandPath,
        ProblemCode::CommandHome,
        ProblemCode::ArgumentInvalid,
        ProblemCode::ArgumentHome,
        ProblemCode::PackageRunner,
        ProblemCode::ExposureInvalid,
        ProblemCode::ToolExposureInvalid,
        ProblemCode::TimeoutInvalid,
        ProblemCode::EnabledInvalid,
        ProblemCode::AllowPackageRunnerInvalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProblemCode::EntryNotObject => "entry-not-object",
            ProblemCode::NameInvalid => "name-invalid",
            ProblemCode::NameReserved => "name-reserved",
            ProblemCode::KeyAuth => "key-auth",
            ProblemCode::KeyCwd => "key-cwd",
            ProblemCode::KeyUnknown => "key-unknown",
            ProblemCode::KeyOtherTransport => "key-other-transport",
            ProblemCode::DescriptionMissing => "description-missing",
            ProblemCode::DescriptionInvalid => "description-invalid",
            ProblemCode::TransportMissing => "transport-missing",
            ProblemCode::TransportConflict => "transport-conflict",
            ProblemCode::TypeSse => "type-sse",
            ProblemCode::TypeInvalid => "type-invalid",
            ProblemCode::TypeMismatch => "type-mismatch",
            ProblemCode::UrlInvalid => "url-invalid",
            ProblemCode::UrlScheme => "url-scheme",
            ProblemCode::UrlNotPlain => "url-not-plain",
            ProblemCode::UrlCredentials => "url-credentials",
            ProblemCode::UrlFragment => "url-fragment",
            ProblemCode::UrlHostReference => "url-host-reference",
            ProblemCode::UrlQueryLiteral => "url-query-literal",
            ProblemCode::ReferenceMalformed => "reference-malformed",
            ProblemCode::HeaderInvalid => "header-invalid",
            ProblemCode::HeaderReserved => "header-reserved",
            ProblemCode::HeaderLiteral => "header-literal",
            ProblemCode::EnvInvalid => "env-invalid",
            ProblemCode::EnvReserved => "env-reserved",
            ProblemCode::EnvLiteral => "env-literal",
            ProblemCode::CommandInvalid => "command-invalid",
            ProblemCode::CommandPath => "command-path",
            ProblemCode::CommandHome => "command-home",
            ProblemCode::ArgumentInvalid => "argument-invalid",
            ProblemCode::ArgumentHome => "argument-home",
            ProblemCode::PackageRunner => "package-runner",
            ProblemCode::ExposureInvalid => "exposure-invalid",
            ProblemCode::ToolExposureInvalid => "tool-exposure-invalid",
            ProblemCode::TimeoutInvalid => "timeout-invalid",
            ProblemCode::EnabledInvalid => "enabled-invalid",
            ProblemCode::AllowPackageRunnerInvalid => "allow-package-runner-invalid",
        }
    }
}

impl fmt::Display for ProblemCode {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One reason a server entry is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub code: ProblemCode,
    /// Where in the entry: `url`, `headers.Authorization`, `args[2]`, `env`, ... Empty for the
    /// entry as a whole.
    pub field: String,
    pub message: String,
}

impl Problem {
    pub fn new(code: ProblemCode, field: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            code,
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{} [{}]", self.message, self.code)
        } else {
            write!(f, "{}: {} [{}]", self.field, self.message, self.code)
        }
    }
}

/// A key as a field label, when it is plain enough to print (letters, digits, `_`, `-`, `.`, `*`,
/// `/`, at most 64 characters); otherwise `None`, and the message speaks of "a key" instead. Keys are
/// names, not values, but a name that is not plain may be a value pasted in the wrong place.
pub fn printable_key(key: &str) -> Option<&str> {
    let plain = !key.is_empty()
        && key.len() <= 64
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.*/".contains(&b));
    plain.then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_kebab_tokens() {
        let mut seen = std::collections::HashSet::new();
        for code in ProblemCode::ALL {
            let s = code.as_str();
            assert!(seen.insert(s), "{s} twice");
            assert!(
                s.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{s}"
            );
        }
    }

    #[test]
    fn printable_keys() {
        assert_eq!(printable_key("Authorization"), Some("Authorization"));
        assert_eq!(printable_key("search_*"), Some("search_*"));
        assert_eq!(printable_key(""), None);
        assert_eq!(printable_key("a b"), None);
        assert_eq!(printable_key("sk-\u{1b}[31m"), None);
        assert_eq!(printable_key(&"k".repeat(65)), None);
    }
}
