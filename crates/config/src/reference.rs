//! References to variables, written `${NAME}`: how the overlay names a credential without holding it.

use std::fmt;

/// The name of a variable a reference points at: capitals, digits and `_`, at least one character.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VarName(String);

impl VarName {
    /// Accepts `[A-Z0-9_]+`.
    pub fn parse(s: &str) -> Option<VarName> {
        let ok = !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        ok.then(|| VarName(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VarName {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One `${NAME}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference(pub VarName);

impl Reference {
    /// Accepts a string that is exactly one reference, nothing before or after it.
    pub fn parse_whole(s: &str) -> Option<Reference> {
        let inner = s.strip_prefix("${")?.strip_suffix('}')?;
        VarName::parse(inner).map(Reference)
    }

    pub fn name(&self) -> &VarName {
        &self.0
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "${{{}}}", self.0)
    }
}

/// A piece of a template: text written as is, or a reference the job fills in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Literal(String),
    Ref(Reference),
}

/// Text that may hold references, as an argument or a URL's path may.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Template(Vec<Part>);

/// A `${` that does not open a well-formed reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MalformedReference;

impl Template {
    /// Splits `s` into literal text and references. A `$` not followed by `{` is literal text; a `${`
    /// must be closed by `}` around a valid name.
    pub fn parse(s: &str) -> Result<Template, MalformedReference> {
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(start) = rest.find("${") {
            if start > 0 {
                parts.push(Part::Literal(rest[..start].to_owned()));
            }
            let after = &rest[start + 2..];
            let end = after.find('}').ok_or(MalformedReference)?;
            let name = VarName::parse(&after[..end]).ok_or(MalformedReference)?;
            parts.push(Part::Ref(Reference(name)));
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_owned()));
        }
        Ok(Template(parts))
    }

    pub fn parts(&self) -> &[Part] {
        &self.0
    }

    /// The references in order of appearance.
    pub fn references(&self) -> impl Iterator<Item = &Reference> {
        self.0.iter().filter_map(|p| match p {
            Part::Ref(r) => Some(r),
            Part::Literal(_) => None,
        })
    }

    /// Whether the written text starts with `s` (only its literal start counts).
    pub fn literal_starts_with(&self, s: &str) -> bool {
        matches!(self.0.first(), Some(Part::Literal(l)) if l.starts_with(s))
    }
}

impl fmt::Display for Template {
    /// Writes the template back as the overlay spells it, references and all.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        for part in &self.0 {
            match part {
                Part::Literal(l) => f.write_str(l)?,
                Part::Ref(r) => write!(f, "{r}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_capitals_digits_and_underscore() {
        for ok in ["A", "DOCS_TOKEN", "_X", "K8S", "9"] {
            assert!(VarName::parse(ok).is_some(), "{ok}");
        }
        for bad in ["", "docs", "Docs", "A-B", "A B", "A.B", "É", "A$"] {
            assert!(VarName::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_whole_reference_has_nothing_around_it() {
        assert_eq!(
            Reference::parse_whole("${DOCS_TOKEN}").map(|r| r.to_string()),
            Some("${DOCS_TOKEN}".to_owned())
        );
        for bad in [
            "$DOCS", "${DOCS", "${docs}", " ${A}", "${A} ", "${A}${B}", "x${A}", "${}", "!cmd",
        ] {
            assert!(Reference::parse_whole(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn templates_split_literals_and_references() {
        let t = Template::parse("--token=${TOKEN}/x/${B}").unwrap();
        assert_eq!(
            t.parts(),
            [
                Part::Literal("--token=".into()),
                Part::Ref(Reference(VarName("TOKEN".into()))),
                Part::Literal("/x/".into()),
                Part::Ref(Reference(VarName("B".into()))),
            ]
        );
        assert_eq!(t.to_string(), "--token=${TOKEN}/x/${B}");
        assert_eq!(
            Template::parse("cost $5").unwrap().parts(),
            [Part::Literal("cost $5".into())]
        );
        assert_eq!(Template::parse("").unwrap().parts(), []);
    }

    #[test]
    fn templates_refuse_a_broken_reference() {
        for bad in ["${", "a${b}", "${A", "x ${A B}", "${}", "${A}${"] {
            assert_eq!(Template::parse(bad), Err(MalformedReference), "{bad}");
        }
    }
}
