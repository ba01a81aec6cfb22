//! The deployment's `.env`: `NAME=value` lines, read strictly.
//!
//! Accepted: blank lines, lines whose first non-blank character is `#`, an optional `export ` before
//! the name, and a value either bare (taken as written up to the end of the line) or wholly inside
//! one pair of `"` or `'` (no escapes are interpreted). Refused, naming the line and never the value:
//! a line without `=`, a name that is not a variable name, a name given twice, an unclosed quote.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DotenvError {
    #[error(".env line {line}: expected NAME=value")]
    NoEquals { line: usize },
    #[error(".env line {line}: the name is not a variable name (letters, digits and '_')")]
    BadName { line: usize },
    #[error(".env line {line}: {name} is set twice")]
    Duplicate { line: usize, name: String },
    #[error(".env line {line}: the value of {name} opens a quote it does not close")]
    Unclosed { line: usize, name: String },
}

/// The settings a `.env` holds, by name.
pub type Dotenv = BTreeMap<String, String>;

pub fn parse(text: &str) -> Result<Dotenv, DotenvError> {
    let mut out = Dotenv::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let trimmed = trimmed.strip_prefix("export ").unwrap_or(trimmed);
        let (name, value) = trimmed
            .split_once('=')
            .ok_or(DotenvError::NoEquals { line })?;
        if !is_variable_name(name) {
            return Err(DotenvError::BadName { line });
        }
        let value = unquote(value).ok_or_else(|| DotenvError::Unclosed {
            line,
            name: name.to_owned(),
        })?;
        if out.insert(name.to_owned(), value.to_owned()).is_some() {
            return Err(DotenvError::Duplicate {
                line,
                name: name.to_owned(),
            });
        }
    }
    Ok(out)
}

/// A variable name: letters, digits and `_`, not starting with a digit.
pub fn is_variable_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn unquote(value: &str) -> Option<&str> {
    for q in ['"', '\''] {
        if let Some(rest) = value.strip_prefix(q) {
            return rest.strip_suffix(q);
        }
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_and_values() {
        let env = parse(
            "# settings\n\nPI_GLOBAL_PI_DIR=/srv/pi-global\nexport PI_EGRESS=0\n  A=\"x y\"\nB='#z'\nC=\nD=a=b\n",
        )
        .unwrap();
        assert_eq!(env["PI_GLOBAL_PI_DIR"], "/srv/pi-global");
        assert_eq!(env["PI_EGRESS"], "0");
        assert_eq!(env["A"], "x y");
        assert_eq!(env["B"], "#z");
        assert_eq!(env["C"], "");
        assert_eq!(env["D"], "a=b");
    }

    #[test]
    fn refuses_bad_lines_without_quoting_values() {
        assert_eq!(
            parse("A=1\njunk-canary\n"),
            Err(DotenvError::NoEquals { line: 2 })
        );
        assert_eq!(parse("1A=x\n"), Err(DotenvError::BadName { line: 1 }));
        assert_eq!(parse("A B=x\n"), Err(DotenvError::BadName { line: 1 }));
        let dup = parse("A=canary1\nA=canary2\n").unwrap_err();
        assert_eq!(
            dup,
            DotenvError::Duplicate {
                line: 2,
                name: "A".into()
            }
        );
        assert!(!dup.to_string().contains("canary"));
        let open = parse("T=\"canary\n").unwrap_err();
        assert!(matches!(open, DotenvError::Unclosed { line: 1, .. }));
        assert!(!open.to_string().contains("canary"));
    }
}
