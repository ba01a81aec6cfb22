//! Reading a delivery's JSON: the few fields the receiver needs, each by its place in the payload
//! (a JSON pointer), so that a missing or mistyped one is named (never its value).

use serde_json::Value;

use protocol::forge_event::ForgeEvent;

/// What a delivery means to the receiver.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// An event the triggers can name.
    Event(Box<ForgeEvent>),
    /// GitHub's ping, sent when the webhook is made.
    Ping,
    /// An event no trigger can name (a closed issue, a push, a comment the worker wrote): why.
    Ignored(String),
}

/// Why a delivery cannot be read: the place in the payload, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("the body is not a JSON object")]
    NotJson,
    #[error("the payload has no {0} of the right type")]
    Missing(&'static str),
    /// A name the worker would build URLs and paths from, outside the forge's own grammar.
    #[error("{0}")]
    Invalid(#[from] protocol::forge_names::Invalid),
}

/// An event held to the forge's grammar for the names the worker builds from
/// (`protocol::forge_names`): a delivery with any other is unreadable, naming the field.
pub fn valid(parsed: Result<Parsed, Unreadable>) -> Result<Parsed, Unreadable> {
    if let Ok(Parsed::Event(event)) = &parsed {
        protocol::forge_names::check(event)?;
    }
    parsed
}

/// The parsed body.
pub struct Payload(Value);

impl Payload {
    pub fn parse(body: &[u8]) -> Result<Payload, Unreadable> {
        match serde_json::from_slice::<Value>(body) {
            Ok(v @ Value::Object(_)) => Ok(Payload(v)),
            _ => Err(Unreadable::NotJson),
        }
    }

    fn at(&self, pointer: &str) -> Option<&Value> {
        self.0.pointer(pointer).filter(|v| !v.is_null())
    }

    /// A string that must be there.
    pub fn text(&self, pointer: &'static str) -> Result<String, Unreadable> {
        self.at(pointer)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or(Unreadable::Missing(pointer))
    }

    /// A string that may be missing or null (an issue without a description): empty then.
    pub fn text_or_empty(&self, pointer: &'static str) -> Result<String, Unreadable> {
        match self.at(pointer) {
            None => Ok(String::new()),
            Some(v) => v
                .as_str()
                .map(str::to_owned)
                .ok_or(Unreadable::Missing(pointer)),
        }
    }

    pub fn optional_text(&self, pointer: &str) -> Option<String> {
        self.at(pointer).and_then(Value::as_str).map(str::to_owned)
    }

    /// A number that must be there.
    pub fn number(&self, pointer: &'static str) -> Result<u64, Unreadable> {
        self.at(pointer)
            .and_then(Value::as_u64)
            .ok_or(Unreadable::Missing(pointer))
    }

    pub fn optional_number(&self, pointer: &str) -> Option<u64> {
        self.at(pointer).and_then(Value::as_u64)
    }

    pub fn flag(&self, pointer: &str) -> bool {
        self.at(pointer).and_then(Value::as_bool).unwrap_or(false)
    }

    pub fn has(&self, pointer: &str) -> bool {
        self.at(pointer).is_some()
    }

    /// The `key` of each object in the array at `pointer` (labels: `name` on GitHub, `title` on
    /// GitLab); an absent array is empty.
    pub fn names(&self, pointer: &'static str, key: &str) -> Result<Vec<String>, Unreadable> {
        let Some(items) = self.at(pointer) else {
            return Ok(Vec::new());
        };
        let items = items.as_array().ok_or(Unreadable::Missing(pointer))?;
        items
            .iter()
            .map(|item| {
                item.get(key)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or(Unreadable::Missing(pointer))
            })
            .collect()
    }
}

/// Whether a delivery id can name a job: 1 to 100 letters, digits, `.`, `_` and `-`.
pub fn is_delivery_id(id: &str) -> bool {
    (1..=100).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The event a forge's webhook body is, as its event header would name it, read from the body
/// alone (for a body saved to a file, without its headers): GitHub's `issues`, `pull_request`,
/// `issue_comment` or `ping`; GitLab's `Issue Hook`, `Merge Request Hook` or `Note Hook`. `None`
/// when it is none of these.
pub fn event_of_body(forge: protocol::forge_event::Forge, body: &[u8]) -> Option<&'static str> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let has = |key: &str| v.get(key).is_some_and(|x| !x.is_null());
    match forge {
        protocol::forge_event::Forge::Github => {
            if has("zen") && has("hook_id") {
                Some("ping")
            } else if has("comment") && has("issue") {
                Some("issue_comment")
            } else if has("pull_request") {
                Some("pull_request")
            } else if has("issue") {
                Some("issues")
            } else {
                None
            }
        }
        protocol::forge_event::Forge::Gitlab => match v.get("object_kind")?.as_str()? {
            "issue" => Some("Issue Hook"),
            "merge_request" => Some("Merge Request Hook"),
            "note" => Some("Note Hook"),
            _ => None,
        },
    }
}
