//! Strict JSON: plain RFC 8259 text (no comments, no trailing commas, no byte-order mark), read into a
//! value that keeps the order of object keys and refuses a key written twice anywhere in the document.
//!
//! serde_json alone would keep the last of two equal keys; that would let a second `"url"` quietly
//! replace the first, so every file of pi-dispatch goes through this reader instead.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value whose objects keep their keys in file order.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    Object(Object),
}

/// A JSON object's members in file order; keys are unique (the reader refuses duplicates).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Object(Vec<(String, Json)>);

impl Object {
    pub fn get(&self, key: &str) -> Option<&Json> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Json)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Json {
    /// The JSON type's name, for messages such as "must be a string, not a number".
    pub fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Number(_) => "a number",
            Json::String(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }

    pub fn as_object(&self) -> Option<&Object> {
        match self {
            Json::Object(o) => Some(o),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }
}

impl serde::Serialize for Json {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self {
            Json::Null => serializer.serialize_unit(),
            Json::Bool(b) => serializer.serialize_bool(*b),
            Json::Number(n) => n.serialize(serializer),
            Json::String(s) => serializer.serialize_str(s),
            Json::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Json::Object(o) => {
                let mut map = serializer.serialize_map(Some(o.len()))?;
                for (k, v) in o.iter() {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl Object {
    /// An object of these members, in this order. The caller keeps the keys unique.
    pub fn from_members(members: Vec<(String, Json)>) -> Object {
        Object(members)
    }
}

/// `value` as pretty JSON (two-space indent, keys in their order) with a final newline.
pub fn to_pretty(value: &Json) -> String {
    // Serializing a Json value cannot fail: every key is a string and every number finite.
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

/// Why a text is not strict JSON. The message says where, never what was written there; a key
/// written twice is named, as [`shown_key`] writes it (keys are names, not values).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    #[error("not JSON: {detail}")]
    Syntax { detail: String },
    #[error(
        "not strict JSON: the key '{key}' is written twice in one object (line {line}, column {column})"
    )]
    DuplicateKey {
        /// The key as [`shown_key`] writes it: escaped, and cut short when long.
        key: String,
        line: usize,
        column: usize,
    },
}

/// Marker text the visitor raises on a repeated key, followed by the key as shown; `parse` turns it
/// into `JsonError::DuplicateKey`.
const DUPLICATE_MARKER: &str = "pi-dispatch: duplicate key: ";

/// The most characters of a key a message shows; a longer one is cut short with `…`.
pub const MAX_SHOWN_KEY_CHARS: usize = 64;

/// A key as a message may show it: printable ASCII as written; a quote or a backslash escaped with
/// a backslash; anything else (a control character, a character outside ASCII, an invisible one) as
/// `\u{…}`, so no key is ever printed raw. Cut at [`MAX_SHOWN_KEY_CHARS`] characters.
pub fn shown_key(key: &str) -> String {
    let mut out = String::new();
    for (i, c) in key.chars().enumerate() {
        if i == MAX_SHOWN_KEY_CHARS {
            out.push('…');
            break;
        }
        match c {
            '\'' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
        }
    }
    out
}

/// Parses `text` as one strict JSON document.
pub fn parse(text: &str) -> Result<Json, JsonError> {
    // serde_json rejects a byte-order mark, comments and trailing commas already; it also stops
    // at 128 levels of nesting with an error rather than overflowing the stack.
    serde_json::from_str::<Json>(text).map_err(|e| {
        let message = e.to_string();
        match message.strip_prefix(DUPLICATE_MARKER) {
            Some(rest) => {
                // serde_json writes a custom error as "MESSAGE at line L column C".
                let position = format!(" at line {} column {}", e.line(), e.column());
                JsonError::DuplicateKey {
                    key: rest.strip_suffix(&position).unwrap_or(rest).to_owned(),
                    line: e.line(),
                    column: e.column(),
                }
            }
            None => JsonError::Syntax {
                detail: syntax_detail(&e),
            },
        }
    })
}

/// serde_json's syntax messages ("expected `,` or `}` at line 3 column 5") name positions and
/// expectations, never the text that was found, so they are safe to show; the category keeps the
/// message short for an early end of file.
fn syntax_detail(e: &serde_json::Error) -> String {
    match e.classify() {
        serde_json::error::Category::Eof => {
            format!(
                "the text ends early (line {}, column {})",
                e.line(),
                e.column()
            )
        }
        _ => e.to_string(),
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json, E> {
        serde_json::Number::from_f64(v)
            .map(Json::Number)
            .ok_or_else(|| E::custom("a number out of range"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut members: Vec<(String, Json)> = Vec::new();
        // A set of the keys seen, so that an object with many keys is checked in linear time.
        let mut seen: HashSet<String> = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!(
                    "{DUPLICATE_MARKER}{}",
                    shown_key(&key)
                )));
            }
            let value = map.next_value()?;
            members.push((key, value));
        }
        Ok(Json::Object(Object(members)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_back_what_it_read_in_the_same_order() {
        let text = r#"{"b": 1, "a": {"z": [true, null, -1.5, "s\n"], "y": {}}}"#;
        let value = parse(text).unwrap();
        let written = to_pretty(&value);
        assert!(written.find("\"b\"").unwrap() < written.find("\"a\"").unwrap());
        assert_eq!(parse(&written).unwrap(), value);
    }

    #[test]
    fn keeps_key_order() {
        let Json::Object(o) = parse(r#"{"b": 1, "a": {"z": [true, null], "y": "s"}}"#).unwrap()
        else {
            panic!("not an object")
        };
        assert_eq!(o.keys().collect::<Vec<_>>(), ["b", "a"]);
        let inner = o.get("a").unwrap().as_object().unwrap();
        assert_eq!(inner.keys().collect::<Vec<_>>(), ["z", "y"]);
    }

    #[test]
    fn refuses_a_duplicate_key_at_any_depth() {
        for text in [
            r#"{"a": 1, "a": 2}"#,
            r#"{"x": {"a": 1, "b": 2, "a": 3}}"#,
            r#"[{"ok": 1}, {"deep": [{"k": 1, "k": 1}]}]"#,
        ] {
            assert!(
                matches!(parse(text), Err(JsonError::DuplicateKey { .. })),
                "{text}"
            );
        }
        // The same key in two different objects is fine.
        assert!(parse(r#"{"a": {"k": 1}, "b": {"k": 1}}"#).is_ok());
    }

    #[test]
    fn duplicate_key_message_names_the_key_and_gives_a_position_not_the_value() {
        let err = parse("{\n  \"api-key\": \"v1\",\n  \"api-key\": \"v2\"\n}").unwrap_err();
        assert_eq!(
            err,
            JsonError::DuplicateKey {
                key: "api-key".into(),
                line: 3,
                column: 11
            }
        );
        let msg = err.to_string();
        assert_eq!(
            msg,
            "not strict JSON: the key 'api-key' is written twice in one object (line 3, column 11)"
        );
        assert!(!msg.contains("v1") && !msg.contains("v2"), "{msg}");
        // Deep in the document, with spaces and an escape.
        let err = parse(r#"[{"x": {"a b\"c": 1, "a b\"c": 2}}]"#).unwrap_err();
        assert!(
            err.to_string()
                .contains(r#"the key 'a b"c' is written twice"#),
            "{err}"
        );
    }

    #[test]
    fn a_duplicate_key_that_is_not_printable_is_shown_escaped() {
        let err = parse("{\"k\\u001b[31m\u{e9}\u{200b}'\": 1, \"k\\u001b[31m\u{e9}\u{200b}'\": 2}")
            .unwrap_err();
        let JsonError::DuplicateKey { key, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(key, "k\\u{1b}[31m\\u{e9}\\u{200b}\\'");
        let msg = err.to_string();
        assert!(
            msg.chars().all(|c| c.is_ascii_graphic() || c == ' '),
            "{msg:?}"
        );
        let long = "k".repeat(100);
        let err = parse(&format!(r#"{{"{long}": 1, "{long}": 2}}"#)).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("the key '{}…' is", "k".repeat(64))),
            "{err}"
        );
        assert_eq!(shown_key("new\nline\\"), "new\\u{a}line\\\\");
    }

    #[test]
    fn refuses_what_is_not_plain_json() {
        for text in [
            "{\"a\": 1,}",           // trailing comma
            "[1, 2,]",               // trailing comma in an array
            "{// c\n\"a\": 1}",      // line comment
            "{/* c */\"a\": 1}",     // block comment
            "\u{feff}{\"a\": 1}",    // byte-order mark
            "{'a': 1}",              // single quotes
            "{a: 1}",                // bare key
            "{\"a\": 1} {\"b\": 2}", // two documents
            "{\"a\": NaN}",
            "",
        ] {
            assert!(
                matches!(parse(text), Err(JsonError::Syntax { .. })),
                "{text:?}"
            );
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let text = "[".repeat(100_000);
        assert!(parse(&text).is_err());
    }

    #[test]
    fn syntax_message_does_not_echo_the_text() {
        let err = parse(r#"{"token": "canary-9f2c" oops}"#).unwrap_err();
        assert!(!err.to_string().contains("canary"), "{err}");
        assert!(!err.to_string().contains("oops"), "{err}");
    }
}
