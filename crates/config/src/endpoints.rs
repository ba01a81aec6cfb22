//! `model-endpoints.json`: the model servers jobs may reach on their own host and port, past the
//! egress allowlist.
//!
//! ```json
//! {"version": 1, "endpoints": [{"id": "gpu-1", "host": "llm.internal.example", "port": 8000, "slots": 4, "keyless": true}]}
//! ```
//!
//! Read strictly: a duplicate key anywhere, an unknown key at either level, a missing or wrong field,
//! two endpoints with one id or one host and port, or the unspecified address refuses the whole file.
//! An endpoint may be on the worker's own machine (`localhost`, `127.0.0.1`: a local model server);
//! the proxy then reaches exactly that port of it. Messages
//! name the endpoint's index and the field, never the value written there.

use std::collections::HashMap;
use std::fmt;
use std::ops::RangeInclusive;

use crate::json::{self, Json, JsonError};
use crate::problem::printable_key;
use crate::url::{self, Host};

pub const FILE_NAME: &str = "model-endpoints.json";
pub const VERSION: u64 = 1;
pub const MAX_ID_CHARS: usize = 32;
pub const PORTS: RangeInclusive<u64> = 1..=65535;
pub const SLOTS: RangeInclusive<u64> = 1..=1024;

/// One declared model server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `^[a-z0-9-]{1,32}$`, unique in the file.
    pub id: String,
    /// A lowercase DNS name or an IPv4 address (loopback for a model server on the worker's own
    /// machine); never `0.0.0.0`.
    pub host: Host,
    pub port: u16,
    /// How many requests the server takes at once, if the file says.
    pub slots: Option<u32>,
    /// Whether the server is reached without a key (default false).
    pub keyless: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelEndpoints {
    pub endpoints: Vec<Endpoint>,
}

impl ModelEndpoints {
    /// No endpoints: what a deployment without the file has.
    pub fn empty() -> Self {
        ModelEndpoints::default()
    }

    /// The endpoint declared on exactly this host and port.
    pub fn find(&self, host: &Host, port: u16) -> Option<&Endpoint> {
        self.endpoints
            .iter()
            .find(|e| e.port == port && e.host == *host)
    }

    pub fn by_id(&self, id: &str) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.id == id)
    }
}

/// A field of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    Id,
    Host,
    Port,
    Slots,
    Keyless,
}

impl Field {
    pub const ALL: [Field; 5] = [
        Field::Id,
        Field::Host,
        Field::Port,
        Field::Slots,
        Field::Keyless,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Field::Id => "id",
            Field::Host => "host",
            Field::Port => "port",
            Field::Slots => "slots",
            Field::Keyless => "keyless",
        }
    }

    pub fn required(self) -> bool {
        matches!(self, Field::Id | Field::Host | Field::Port)
    }

    /// What the field must be, as a message's ending.
    pub fn rule(self) -> &'static str {
        match self {
            Field::Id => "must be a string of 1 to 32 lowercase letters, digits and '-'",
            Field::Host => {
                "must be a string holding a lowercase DNS name or a dotted IPv4 address (no scheme, port or path)"
            }
            Field::Port => "must be a whole number from 1 to 65535",
            Field::Slots => "must be a whole number from 1 to 1024",
            Field::Keyless => "must be true or false",
        }
    }

    pub fn code(self) -> &'static str {
        match self {
            Field::Id => "id-invalid",
            Field::Host => "host-invalid",
            Field::Port => "port-invalid",
            Field::Slots => "slots-invalid",
            Field::Keyless => "keyless-invalid",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why `model-endpoints.json` is refused. Messages name the index and field, never a value (an
/// unknown key is named only when it is plain, as in `mcp.json`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointsError {
    #[error("model-endpoints.json: {0}")]
    Json(JsonError),
    #[error("model-endpoints.json must be an object with 'version' and 'endpoints'")]
    NotAnObject,
    #[error("model-endpoints.json has a top-level key pi-dispatch does not know{}", key_suffix(.0))]
    UnknownKey(Option<String>),
    #[error("model-endpoints.json has no '{0}'")]
    Missing(&'static str),
    #[error("model-endpoints.json: version must be the number 1")]
    Version,
    #[error("model-endpoints.json: endpoints must be an array")]
    EndpointsNotArray,
    #[error("model-endpoints.json: endpoints[{index}] must be an object")]
    EntryNotObject { index: usize },
    #[error("model-endpoints.json: endpoints[{index}] has a key pi-dispatch does not know{}", key_suffix(.key))]
    EntryUnknownKey { index: usize, key: Option<String> },
    #[error("model-endpoints.json: endpoints[{index}].{field} is missing")]
    FieldMissing { index: usize, field: Field },
    #[error("model-endpoints.json: endpoints[{index}].{field} {}", .field.rule())]
    FieldInvalid { index: usize, field: Field },
    #[error(
        "model-endpoints.json: endpoints[{index}].host is the unspecified address, which names no machine; write the server's own address (127.0.0.1 for this machine)"
    )]
    HostUnspecified { index: usize },
    #[error("model-endpoints.json: endpoints[{index}].id is also the id of endpoints[{first}]")]
    DuplicateId { index: usize, first: usize },
    #[error(
        "model-endpoints.json: endpoints[{index}] has the same host and port as endpoints[{first}]"
    )]
    DuplicateHostPort { index: usize, first: usize },
}

fn key_suffix(key: &Option<String>) -> String {
    key.as_ref().map(|k| format!(": '{k}'")).unwrap_or_default()
}

impl EndpointsError {
    pub fn code(&self) -> &'static str {
        match self {
            EndpointsError::Json(JsonError::DuplicateKey { .. }) => "duplicate-key",
            EndpointsError::Json(JsonError::Syntax { .. }) => "not-json",
            EndpointsError::NotAnObject
            | EndpointsError::UnknownKey(_)
            | EndpointsError::Missing(_)
            | EndpointsError::EndpointsNotArray => "top-level-invalid",
            EndpointsError::Version => "version-unsupported",
            EndpointsError::EntryNotObject { .. } => "entry-not-object",
            EndpointsError::EntryUnknownKey { .. } => "key-unknown",
            EndpointsError::FieldMissing { .. } => "field-missing",
            EndpointsError::FieldInvalid { field, .. } => field.code(),
            EndpointsError::HostUnspecified { .. } => "host-unspecified",
            EndpointsError::DuplicateId { .. } => "id-duplicate",
            EndpointsError::DuplicateHostPort { .. } => "host-port-duplicate",
        }
    }
}

/// Reads the text of `model-endpoints.json`.
pub fn parse_model_endpoints(text: &str) -> Result<ModelEndpoints, EndpointsError> {
    let root = json::parse(text).map_err(EndpointsError::Json)?;
    let Json::Object(root) = root else {
        return Err(EndpointsError::NotAnObject);
    };
    if let Some(key) = root.keys().find(|k| !matches!(*k, "version" | "endpoints")) {
        return Err(EndpointsError::UnknownKey(
            printable_key(key).map(str::to_owned),
        ));
    }
    match root.get("version") {
        None => return Err(EndpointsError::Missing("version")),
        Some(v) if whole_number(v) == Some(VERSION) => {}
        Some(_) => return Err(EndpointsError::Version),
    }
    let items = match root.get("endpoints") {
        None => return Err(EndpointsError::Missing("endpoints")),
        Some(Json::Array(items)) => items,
        Some(_) => return Err(EndpointsError::EndpointsNotArray),
    };

    let mut endpoints: Vec<Endpoint> = Vec::with_capacity(items.len());
    let mut ids: HashMap<String, usize> = HashMap::new();
    let mut places: HashMap<(String, u16), usize> = HashMap::new();
    for (index, item) in items.iter().enumerate() {
        let endpoint = parse_endpoint(index, item)?;
        if let Some(&first) = ids.get(&endpoint.id) {
            return Err(EndpointsError::DuplicateId { index, first });
        }
        // A host's text is unique to it: a name never reads as an IPv4 address.
        let place = (endpoint.host.to_string(), endpoint.port);
        if let Some(&first) = places.get(&place) {
            return Err(EndpointsError::DuplicateHostPort { index, first });
        }
        ids.insert(endpoint.id.clone(), index);
        places.insert(place, index);
        endpoints.push(endpoint);
    }
    Ok(ModelEndpoints { endpoints })
}

fn parse_endpoint(index: usize, item: &Json) -> Result<Endpoint, EndpointsError> {
    let Json::Object(o) = item else {
        return Err(EndpointsError::EntryNotObject { index });
    };
    if let Some(key) = o
        .keys()
        .find(|k| !Field::ALL.iter().any(|f| f.as_str() == *k))
    {
        return Err(EndpointsError::EntryUnknownKey {
            index,
            key: printable_key(key).map(str::to_owned),
        });
    }
    if let Some(field) = Field::ALL
        .into_iter()
        .find(|f| f.required() && o.get(f.as_str()).is_none())
    {
        return Err(EndpointsError::FieldMissing { index, field });
    }
    let invalid = |field| EndpointsError::FieldInvalid { index, field };
    let get = |field: Field| o.get(field.as_str());

    let id = get(Field::Id)
        .and_then(Json::as_str)
        .filter(|s| is_id(s))
        .ok_or(invalid(Field::Id))?
        .to_owned();

    let host = get(Field::Host)
        .and_then(Json::as_str)
        .and_then(|s| url::parse_host_name(s).ok())
        .ok_or(invalid(Field::Host))?;
    if matches!(host, Host::Ipv4(a) if a.is_unspecified()) {
        return Err(EndpointsError::HostUnspecified { index });
    }

    let port = get(Field::Port)
        .and_then(whole_number)
        .filter(|n| PORTS.contains(n))
        .and_then(|n| u16::try_from(n).ok())
        .ok_or(invalid(Field::Port))?;

    let slots = match get(Field::Slots) {
        None => None,
        Some(v) => Some(
            whole_number(v)
                .filter(|n| SLOTS.contains(n))
                .and_then(|n| u32::try_from(n).ok())
                .ok_or(invalid(Field::Slots))?,
        ),
    };

    let keyless = match get(Field::Keyless) {
        None => false,
        Some(Json::Bool(b)) => *b,
        Some(_) => return Err(invalid(Field::Keyless)),
    };

    Ok(Endpoint {
        id,
        host,
        port,
        slots,
        keyless,
    })
}

/// `^[a-z0-9-]{1,32}$`.
fn is_id(s: &str) -> bool {
    (1..=MAX_ID_CHARS).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A number written as a non-negative integer (`8000`, not `8000.0`, `8e3` or `"8000"`).
fn whole_number(v: &Json) -> Option<u64> {
    match v {
        Json::Number(n) => n.as_u64(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn ok(text: &str) -> ModelEndpoints {
        match parse_model_endpoints(text) {
            Ok(m) => m,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    fn err(text: &str) -> EndpointsError {
        match parse_model_endpoints(text) {
            Ok(m) => panic!("{text} accepted as {m:?}"),
            Err(e) => e,
        }
    }

    /// A file holding `entries`, each the text of one endpoint.
    fn file(entries: &[&str]) -> String {
        format!(r#"{{"version": 1, "endpoints": [{}]}}"#, entries.join(", "))
    }

    /// An endpoint object from `fields` over the defaults; a field given as `None` is left out.
    fn entry(fields: &[(&str, Option<&str>)]) -> String {
        let mut all: Vec<(&str, Option<&str>)> = vec![
            ("id", Some(r#""a""#)),
            ("host", Some(r#""h.example""#)),
            ("port", Some("1")),
        ];
        for (k, v) in fields {
            match all.iter_mut().find(|(key, _)| key == k) {
                Some(slot) => slot.1 = *v,
                None => all.push((k, *v)),
            }
        }
        let members: Vec<String> = all
            .iter()
            .filter_map(|(k, v)| v.map(|v| format!(r#""{k}": {v}"#)))
            .collect();
        format!("{{{}}}", members.join(", "))
    }

    fn field_err(fields: &[(&str, Option<&str>)]) -> EndpointsError {
        let ok_entry = entry(&[("id", Some(r#""ok""#)), ("host", Some(r#""ok.example""#))]);
        err(&file(&[&ok_entry, &entry(fields)]))
    }

    fn invalid(field: Field) -> EndpointsError {
        EndpointsError::FieldInvalid { index: 1, field }
    }

    #[test]
    fn reads_the_documented_shape() {
        let m = ok(
            r#"{"version": 1, "endpoints": [{"id": "gpu-1", "host": "llm.internal.example", "port": 8000, "slots": 4, "keyless": true}, {"id": "b", "host": "10.0.0.7", "port": 65535}]}"#,
        );
        assert_eq!(
            m.endpoints,
            [
                Endpoint {
                    id: "gpu-1".into(),
                    host: Host::Name("llm.internal.example".into()),
                    port: 8000,
                    slots: Some(4),
                    keyless: true,
                },
                Endpoint {
                    id: "b".into(),
                    host: Host::Ipv4(Ipv4Addr::new(10, 0, 0, 7)),
                    port: 65535,
                    slots: None,
                    keyless: false,
                },
            ]
        );
        let ip = Host::Ipv4(Ipv4Addr::new(10, 0, 0, 7));
        assert_eq!(m.find(&ip, 65535).map(|e| e.id.as_str()), Some("b"));
        assert!(m.find(&ip, 8000).is_none());
        assert!(m.find(&Host::Name("10.0.0.7".into()), 65535).is_none());
        assert_eq!(m.by_id("gpu-1").map(|e| e.port), Some(8000));
        assert_eq!(
            ok(r#"{"version": 1, "endpoints": []}"#),
            ModelEndpoints::empty()
        );
        assert!(ModelEndpoints::empty().endpoints.is_empty());
    }

    #[test]
    fn the_top_level_is_an_object_with_version_1_and_endpoints() {
        assert_eq!(err("[]"), EndpointsError::NotAnObject);
        assert_eq!(err(r#""x""#), EndpointsError::NotAnObject);
        assert_eq!(
            err(r#"{"endpoints": []}"#),
            EndpointsError::Missing("version")
        );
        assert_eq!(
            err(r#"{"version": 1}"#),
            EndpointsError::Missing("endpoints")
        );
        for v in ["2", "0", "1.0", r#""1""#, "true", "null", "-1", "1e0"] {
            let e = err(&format!(r#"{{"version": {v}, "endpoints": []}}"#));
            assert_eq!(e, EndpointsError::Version, "{v}");
            assert_eq!(e.code(), "version-unsupported");
        }
        for v in ["{}", r#""""#, "null", "1"] {
            assert_eq!(
                err(&format!(r#"{{"version": 1, "endpoints": {v}}}"#)),
                EndpointsError::EndpointsNotArray,
                "{v}"
            );
        }
    }

    #[test]
    fn refuses_unknown_keys_at_both_levels() {
        let e = err(r#"{"version": 1, "endpoints": [], "extra": true}"#);
        assert_eq!(e, EndpointsError::UnknownKey(Some("extra".into())));
        assert_eq!(e.code(), "top-level-invalid");
        let e = field_err(&[("weight", Some("1"))]);
        assert_eq!(
            e,
            EndpointsError::EntryUnknownKey {
                index: 1,
                key: Some("weight".into())
            }
        );
        assert_eq!(e.code(), "key-unknown");
        // A key that is not plain is not printed.
        assert_eq!(
            field_err(&[("a b", Some("1"))]),
            EndpointsError::EntryUnknownKey {
                index: 1,
                key: None
            }
        );
        // Keys are case-sensitive.
        assert!(matches!(
            field_err(&[("Port", Some("1"))]),
            EndpointsError::EntryUnknownKey { index: 1, .. }
        ));
    }

    #[test]
    fn each_endpoint_is_an_object() {
        let e = err(&file(&[&entry(&[]), "[]"]));
        assert_eq!(e, EndpointsError::EntryNotObject { index: 1 });
        assert_eq!(e.code(), "entry-not-object");
    }

    #[test]
    fn id_host_and_port_are_required() {
        for field in [Field::Id, Field::Host, Field::Port] {
            let e = field_err(&[(field.as_str(), None)]);
            assert_eq!(e, EndpointsError::FieldMissing { index: 1, field });
            assert_eq!(
                e.to_string(),
                format!("model-endpoints.json: endpoints[1].{field} is missing")
            );
        }
    }

    #[test]
    fn id_rule() {
        for good in ["a", "gpu-1", "-", "0", &"a".repeat(32)] {
            let v = format!("\"{good}\"");
            assert_eq!(
                ok(&file(&[&entry(&[("id", Some(&v))])])).endpoints[0].id,
                good
            );
        }
        for bad in [
            r#""""#,
            r#""GPU""#,
            r#""gpu_1""#,
            r#""gpu.1""#,
            r#""gpu 1""#,
            r#""é""#,
            "1",
            "null",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain([format!("\"{}\"", "a".repeat(33))])
        {
            let e = field_err(&[("id", Some(&bad))]);
            assert_eq!(e, invalid(Field::Id), "{bad}");
            assert_eq!(e.code(), "id-invalid");
        }
    }

    #[test]
    fn host_rule() {
        let host = |v: &str| {
            ok(&file(&[&entry(&[("host", Some(v))])])).endpoints[0]
                .host
                .clone()
        };
        assert_eq!(
            host(r#""llm.internal.example""#),
            Host::Name("llm.internal.example".into())
        );
        assert_eq!(host(r#""gpu""#), Host::Name("gpu".into()));
        assert_eq!(
            host(r#""192.0.2.1""#),
            Host::Ipv4(Ipv4Addr::new(192, 0, 2, 1))
        );
        for bad in [
            r#""""#,
            r#""LLM.example""#,
            r#""http://llm.example""#,
            r#""llm.example:8000""#,
            r#""llm.example/v1""#,
            r#""llm.example.""#,
            r#""-llm.example""#,
            r#""*.example""#,
            r#""[2001:db8::1]""#,
            r#""2001:db8::1""#,
            r#""127.1""#,
            r#""10.0.0.010""#,
            r#"" llm.example""#,
            "1",
            "null",
        ] {
            let e = field_err(&[("host", Some(bad))]);
            assert_eq!(e, invalid(Field::Host), "{bad}");
            assert_eq!(e.code(), "host-invalid");
        }
    }

    #[test]
    fn host_may_be_this_machine_but_not_the_unspecified_address() {
        for own in ["localhost", "a.localhost", "127.0.0.1", "127.1.2.3"] {
            let text = format!(
                r#"{{"version": 1, "endpoints": [{{"id": "own", "host": "{own}", "port": 8000}}]}}"#
            );
            let parsed = parse_model_endpoints(&text).unwrap();
            assert!(url::is_loopback(&parsed.endpoints[0].host), "{own}");
        }
        let e = field_err(&[("host", Some("\"0.0.0.0\""))]);
        assert_eq!(e, EndpointsError::HostUnspecified { index: 1 });
        assert_eq!(e.code(), "host-unspecified");
        assert!(!e.to_string().contains("0.0.0.0 "), "{e}");
    }

    #[test]
    fn port_rule() {
        for (v, port) in [("1", 1), ("8000", 8000), ("65535", 65535)] {
            assert_eq!(
                ok(&file(&[&entry(&[("port", Some(v))])])).endpoints[0].port,
                port
            );
        }
        for bad in [
            "0",
            "65536",
            "-1",
            "8000.0",
            "8e3",
            r#""8000""#,
            "true",
            "null",
            "18446744073709551616",
        ] {
            let e = field_err(&[("port", Some(bad))]);
            assert_eq!(e, invalid(Field::Port), "{bad}");
            assert_eq!(
                e.to_string(),
                "model-endpoints.json: endpoints[1].port must be a whole number from 1 to 65535"
            );
        }
    }

    #[test]
    fn slots_rule() {
        let slots = |v: &str| ok(&file(&[&entry(&[("slots", Some(v))])])).endpoints[0].slots;
        assert_eq!(slots("1"), Some(1));
        assert_eq!(slots("1024"), Some(1024));
        assert_eq!(ok(&file(&[&entry(&[])])).endpoints[0].slots, None);
        for bad in ["0", "1025", "-4", "4.0", r#""4""#, "null", "false"] {
            let e = field_err(&[("slots", Some(bad))]);
            assert_eq!(e, invalid(Field::Slots), "{bad}");
            assert_eq!(e.code(), "slots-invalid");
        }
    }

    #[test]
    fn keyless_rule() {
        let keyless = |v: &str| ok(&file(&[&entry(&[("keyless", Some(v))])])).endpoints[0].keyless;
        assert!(keyless("true"));
        assert!(!keyless("false"));
        assert!(!ok(&file(&[&entry(&[])])).endpoints[0].keyless);
        for bad in [r#""true""#, "1", "0", "null"] {
            let e = field_err(&[("keyless", Some(bad))]);
            assert_eq!(e, invalid(Field::Keyless), "{bad}");
            assert_eq!(e.code(), "keyless-invalid");
        }
    }

    #[test]
    fn refuses_two_endpoints_with_one_id() {
        let a = entry(&[("id", Some(r#""x""#)), ("host", Some(r#""a.example""#))]);
        let b = entry(&[("id", Some(r#""y""#)), ("host", Some(r#""b.example""#))]);
        let c = entry(&[("id", Some(r#""x""#)), ("host", Some(r#""c.example""#))]);
        let e = err(&file(&[&a, &b, &c]));
        assert_eq!(e, EndpointsError::DuplicateId { index: 2, first: 0 });
        assert_eq!(e.code(), "id-duplicate");
    }

    #[test]
    fn refuses_two_endpoints_on_one_host_and_port() {
        let a = entry(&[
            ("id", Some(r#""a""#)),
            ("host", Some(r#""10.0.0.1""#)),
            ("port", Some("8000")),
        ]);
        let b = entry(&[
            ("id", Some(r#""b""#)),
            ("host", Some(r#""10.0.0.1""#)),
            ("port", Some("8001")),
        ]);
        let c = entry(&[
            ("id", Some(r#""c""#)),
            ("host", Some(r#""10.0.0.1""#)),
            ("port", Some("8000")),
        ]);
        let e = err(&file(&[&a, &b, &c]));
        assert_eq!(e, EndpointsError::DuplicateHostPort { index: 2, first: 0 });
        assert_eq!(e.code(), "host-port-duplicate");
        // One host on two ports, or two hosts on one port, is fine.
        let d = entry(&[
            ("id", Some(r#""d""#)),
            ("host", Some(r#""10.0.0.2""#)),
            ("port", Some("8000")),
        ]);
        assert_eq!(ok(&file(&[&a, &b, &d])).endpoints.len(), 3);
    }

    #[test]
    fn a_duplicate_json_key_refuses_the_file() {
        let e = err(
            r#"{"version": 1, "endpoints": [{"id": "a", "host": "h.example", "port": 1, "port": 2}]}"#,
        );
        assert!(
            matches!(e, EndpointsError::Json(JsonError::DuplicateKey { .. })),
            "{e:?}"
        );
        assert_eq!(e.code(), "duplicate-key");
        let e = err(r#"{"version": 1, "version": 1, "endpoints": []}"#);
        assert_eq!(e.code(), "duplicate-key");
        assert_eq!(err("{").code(), "not-json");
        assert_eq!(
            err(r#"{"version": 1, "endpoints": [],}"#).code(),
            "not-json"
        );
    }

    #[test]
    fn messages_never_quote_a_value() {
        let canary = "canary-7f3a";
        let ok_entry = entry(&[("id", Some(r#""ok""#)), ("host", Some(r#""ok.example""#))]);
        let s = |v: &str| format!("\"{v}\"");
        let mut texts = vec![
            format!(r#"{{"version": {}, "endpoints": []}}"#, s(canary)),
            format!(r#"{{"version": 1, "endpoints": {}}}"#, s(canary)),
            format!(r#"{{"version": 1, "endpoints": [{}]}}"#, s(canary)),
            format!(r#"{{"version": 1, "endpoints": [], "x": {}}}"#, s(canary)),
            format!(
                r#"{{"version": 1, "endpoints": [], "x": {} oops}}"#,
                s(canary)
            ),
            format!(
                r#"{{"version": 1, "endpoints": [], "k": {}, "k": 1}}"#,
                s(canary)
            ),
            format!(
                r#"{{"version": 1, "endpoints": [{{"id": {}}}]}}"#,
                s(canary)
            ),
            format!(
                r#"{{"version": 1, "endpoints": [{{"id": "a", "host": "h", "extra": {}}}]}}"#,
                s(canary)
            ),
        ];
        for (field, value) in [
            ("id", s(&canary.to_uppercase())),
            ("id", s(&format!("{canary}-{}", "x".repeat(40)))),
            ("host", s(&format!("https://{canary}.example"))),
            ("host", s(&format!("{canary}.example:8000"))),
            ("host", s(&format!("{canary}..example"))),
            ("port", s(canary)),
            ("slots", s(canary)),
            ("keyless", s(canary)),
        ] {
            texts.push(file(&[&ok_entry, &entry(&[(field, Some(&value))])]));
        }
        // Duplicates: the repeated id or host is valid, and still never quoted.
        let first = entry(&[
            ("id", Some(&s(canary))),
            ("host", Some(r#""canary-a.example""#)),
        ]);
        let same_id = entry(&[
            ("id", Some(&s(canary))),
            ("host", Some(r#""canary-b.example""#)),
        ]);
        texts.push(file(&[&first, &same_id]));
        let same_place = entry(&[
            ("id", Some(r#""other""#)),
            ("host", Some(r#""canary-a.example""#)),
        ]);
        texts.push(file(&[&first, &same_place]));
        for text in texts {
            let msg = err(&text).to_string().to_lowercase();
            assert!(!msg.contains("canary"), "{text}: {msg}");
        }
    }
}
