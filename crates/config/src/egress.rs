//! The egress allowlist (`egress-allowlist.conf`) and the rule by which the egress proxy decides
//! whether a job may reach a host and port.
//!
//! The file holds one bare host per line: a lowercase DNS name, a dotted IPv4 address or a bracketed
//! IPv6 address, or `.name` for the name's subdomains (never the name itself). Blank lines and lines
//! whose first non-blank character is `#` are comments, a `#` after a space or tab starts a trailing
//! comment, and spaces and tabs around an entry are ignored. Anything else refuses the file, naming
//! the line and never what is written there.
//!
//! [`route`] is pure and never looks a name up: the proxy enforces it, and `doctor` and the pickup
//! gates predict with it.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::endpoints::ModelEndpoints;
use crate::url::{Host, Scheme};

pub const FILE_NAME: &str = "egress-allowlist.conf";

/// The only port an allowlist entry opens (and only for `https`).
pub const ALLOWLIST_PORT: u16 = 443;

pub const MAX_NAME_CHARS: usize = 253;
pub const MAX_LABEL_CHARS: usize = 63;

/// One allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// Exactly this host.
    Host(Host),
    /// `.name`: every subdomain of the name (held without its leading dot), not the name itself.
    Subdomains(String),
}

impl Entry {
    /// Whether this entry names `host`.
    pub fn names(&self, host: &Host) -> bool {
        match (self, host) {
            (Entry::Host(h), host) => h == host,
            (Entry::Subdomains(parent), Host::Name(name)) => is_subdomain(name, parent),
            (Entry::Subdomains(_), _) => false,
        }
    }
}

/// Writes the entry as the file has it (an IPv6 address in its short form).
impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Entry::Host(h) => write!(f, "{h}"),
            Entry::Subdomains(parent) => write!(f, ".{parent}"),
        }
    }
}

/// `name` is `<one or more labels>.parent`.
fn is_subdomain(name: &str, parent: &str) -> bool {
    name.strip_suffix(parent)
        .and_then(|head| head.strip_suffix('.'))
        .is_some_and(|head| !head.is_empty())
}

/// The hosts an allowlist names, in file order, with indexes for matching in time linear in the
/// number of a name's labels.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Allowlist {
    entries: Vec<Entry>,
    names: HashSet<String>,
    subdomains: HashSet<String>,
    ipv4: HashSet<Ipv4Addr>,
    ipv6: HashSet<Ipv6Addr>,
}

impl Allowlist {
    /// Whether the allowlist names `host` (exactly, or through a leading-dot entry).
    pub fn names(&self, host: &Host) -> bool {
        match host {
            Host::Ipv4(a) => self.ipv4.contains(a),
            Host::Ipv6(a) => self.ipv6.contains(a),
            Host::Name(name) => {
                self.names.contains(name)
                    || name
                        .match_indices('.')
                        .any(|(i, _)| i > 0 && self.subdomains.contains(&name[i + 1..]))
            }
        }
    }

    /// The entries in file order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    fn insert(&mut self, entry: Entry) {
        match &entry {
            Entry::Host(Host::Name(n)) => {
                self.names.insert(n.clone());
            }
            Entry::Host(Host::Ipv4(a)) => {
                self.ipv4.insert(*a);
            }
            Entry::Host(Host::Ipv6(a)) => {
                self.ipv6.insert(*a);
            }
            Entry::Subdomains(parent) => {
                self.subdomains.insert(parent.clone());
            }
        }
        self.entries.push(entry);
    }
}

/// Why the allowlist is refused. Messages name the line, never its text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowlistError {
    #[error("egress-allowlist.conf line {line}: {why}")]
    Line { line: usize, why: &'static str },
    #[error("egress-allowlist.conf line {line}: the same entry as line {first}")]
    Duplicate { line: usize, first: usize },
}

impl AllowlistError {
    pub fn code(&self) -> &'static str {
        match self {
            AllowlistError::Line { .. } => "allowlist-line-invalid",
            AllowlistError::Duplicate { .. } => "allowlist-duplicate",
        }
    }

    /// The line number (from 1) the problem is on.
    pub fn line(&self) -> usize {
        match self {
            AllowlistError::Line { line, .. } | AllowlistError::Duplicate { line, .. } => *line,
        }
    }
}

const WHY_SCHEME: &str = "a scheme such as https:// is not allowed; write the bare host";
const WHY_SPACE: &str =
    "an entry is one host with no space inside it (a trailing comment starts with a space and '#')";
const WHY_WILDCARD: &str =
    "'*' is not allowed; write a leading '.' (as in .example.com) for a name's subdomains";
const WHY_PATH: &str = "a path is not allowed; write the bare host";
const WHY_UPPERCASE: &str = "uppercase letters are not allowed; write the host in lowercase";
const WHY_HASH: &str = "'#' starts a comment only at the start of a line or after a space or tab";
const WHY_PORT: &str = "a port is not allowed; an allowlist entry opens https on port 443 only";
const WHY_IPV6: &str = "the text in brackets is not an IPv6 address";
const WHY_IPV6_BRACKETS: &str = "an IPv6 address must be written in brackets, as in [2001:db8::1]";
const WHY_BARE_DOT: &str = "a '.' alone is not a host";
const WHY_SUBDOMAINS: &str = "a leading '.' must be followed by a DNS name, not an address";
pub(crate) const WHY_NAME: &str = "not a host: a name is labels of lowercase letters, digits, '-' and '_' joined by single dots, none starting or ending with '-', at most 63 characters each and 253 in all";
pub(crate) const WHY_IPV4: &str =
    "a host whose last label is a number must be an IPv4 address in dotted form, as in 192.0.2.1";

/// Reads the text of `egress-allowlist.conf`.
pub fn parse_allowlist(text: &str) -> Result<Allowlist, AllowlistError> {
    let mut list = Allowlist::default();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = trim_blanks(raw);
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let content = trim_blanks(strip_trailing_comment(trimmed));
        let entry = parse_entry(content).map_err(|why| AllowlistError::Line { line, why })?;
        if let Some(&first) = seen.get(&entry.to_string()) {
            return Err(AllowlistError::Duplicate { line, first });
        }
        seen.insert(entry.to_string(), line);
        list.insert(entry);
    }
    Ok(list)
}

fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

fn trim_blanks(s: &str) -> &str {
    s.trim_matches(is_blank)
}

/// The line up to its first `#` that follows a space or tab.
fn strip_trailing_comment(line: &str) -> &str {
    line.match_indices('#')
        .find(|(i, _)| line[..*i].ends_with(is_blank))
        .map_or(line, |(i, _)| &line[..i])
}

fn parse_entry(text: &str) -> Result<Entry, &'static str> {
    if text.contains("://") {
        return Err(WHY_SCHEME);
    }
    if text.contains(is_blank) {
        return Err(WHY_SPACE);
    }
    if text.contains('*') {
        return Err(WHY_WILDCARD);
    }
    if text.contains('/') {
        return Err(WHY_PATH);
    }
    if text.contains(|c: char| c.is_ascii_uppercase()) {
        return Err(WHY_UPPERCASE);
    }
    if text.contains('#') {
        return Err(WHY_HASH);
    }
    if let Some(after_bracket) = text.strip_prefix('[') {
        let (inside, after) = after_bracket.split_once(']').ok_or(WHY_IPV6)?;
        if !after.is_empty() {
            return Err(if after.starts_with(':') {
                WHY_PORT
            } else {
                WHY_IPV6
            });
        }
        let addr: Ipv6Addr = inside.parse().map_err(|_| WHY_IPV6)?;
        return Ok(Entry::Host(Host::Ipv6(addr)));
    }
    if text.contains(':') {
        if text.parse::<Ipv6Addr>().is_ok() {
            return Err(WHY_IPV6_BRACKETS);
        }
        let port_like = text
            .rsplit_once(':')
            .is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        return Err(if port_like { WHY_PORT } else { WHY_NAME });
    }
    if text == "." {
        return Err(WHY_BARE_DOT);
    }
    if let Some(parent) = text.strip_prefix('.') {
        return match parse_name_or_ipv4(parent)? {
            Host::Name(n) => Ok(Entry::Subdomains(n)),
            Host::Ipv4(_) | Host::Ipv6(_) => Err(WHY_SUBDOMAINS),
        };
    }
    parse_name_or_ipv4(text).map(Entry::Host)
}

/// A host by the one rule of [`crate::url`], explained in this file's words.
pub(crate) fn parse_name_or_ipv4(name: &str) -> Result<Host, &'static str> {
    crate::url::parse_host_name(name).map_err(|e| match e {
        crate::url::HostNameError::Name => WHY_NAME,
        crate::url::HostNameError::Ipv4 => WHY_IPV4,
    })
}

// The loopback rule is a property of a host, so it lives beside `Host` (model endpoints use it too).
pub use crate::url::is_loopback;

/// How a connection the proxy lets through is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `https` on port 443 to a host the allowlist names.
    Allowlisted,
    /// The exact host and port of a model endpoint in `model-endpoints.json`.
    DeclaredEndpoint { id: String },
}

/// Why the proxy refuses a connection. Messages never name the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unreachable {
    #[error("plain http to port 443 is refused; that port is for https")]
    PlainHttpOn443,
    #[error("the host is the egress proxy's own machine (loopback), which jobs never reach")]
    Loopback,
    #[error(
        "the host is neither in egress-allowlist.conf (which opens https on port 443 only) nor, with this port, declared in model-endpoints.json"
    )]
    NotAllowed,
}

impl Unreachable {
    pub fn code(self) -> &'static str {
        match self {
            Unreachable::PlainHttpOn443 => "egress-plain-http-443",
            Unreachable::Loopback => "egress-loopback",
            Unreachable::NotAllowed => "egress-not-allowed",
        }
    }
}

/// Whether a job may reach `scheme://host:port` through the egress proxy, and how.
///
/// In order: `http` on port 443 is refused; a model endpoint declaring exactly this host and port
/// is reached (even on the proxy's own machine: a local model server, and only that port of it);
/// any other host that is the proxy's own machine ([`is_loopback`]) is refused; `https` on port
/// 443 to a host the allowlist names is reached; everything else is refused.
///
/// This is the rule as far as it can be judged without looking a name up: the proxy applies it,
/// then also refuses an allowlisted name whose addresses are its own machine or not public
/// (loopback, link-local, unspecified, multicast); doctor and the pickup predict with it alone.
pub fn route(
    scheme: Scheme,
    host: &Host,
    port: u16,
    allowlist: &Allowlist,
    endpoints: &ModelEndpoints,
) -> Result<Route, Unreachable> {
    if scheme == Scheme::Http && port == ALLOWLIST_PORT {
        return Err(Unreachable::PlainHttpOn443);
    }
    if let Some(endpoint) = endpoints.find(host, port) {
        return Ok(Route::DeclaredEndpoint {
            id: endpoint.id.clone(),
        });
    }
    // The proxy's own machine is never reachable through the allowlist, however it is listed: say
    // so before "not allowed", since no allowlist entry could change it.
    if is_loopback(host) {
        return Err(Unreachable::Loopback);
    }
    if scheme == Scheme::Https && port == ALLOWLIST_PORT && allowlist.names(host) {
        return Ok(Route::Allowlisted);
    }
    Err(Unreachable::NotAllowed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoints::{Endpoint, parse_model_endpoints};

    fn list(text: &str) -> Allowlist {
        match parse_allowlist(text) {
            Ok(l) => l,
            Err(e) => panic!("{text:?}: {e}"),
        }
    }

    fn refused(text: &str) -> AllowlistError {
        match parse_allowlist(text) {
            Ok(l) => panic!("{text:?} accepted as {:?}", l.entries()),
            Err(e) => e,
        }
    }

    fn name(n: &str) -> Host {
        Host::Name(n.into())
    }

    fn v4(a: [u8; 4]) -> Host {
        Host::Ipv4(Ipv4Addr::from(a))
    }

    fn v6(s: &str) -> Host {
        Host::Ipv6(s.parse().unwrap())
    }

    #[test]
    fn reads_names_addresses_and_subdomain_entries() {
        let l = list("api.example.com\n10.0.0.1\n[2001:db8::1]\n.example.org\n_srv.x-y.example\n");
        assert_eq!(
            l.entries(),
            [
                Entry::Host(name("api.example.com")),
                Entry::Host(v4([10, 0, 0, 1])),
                Entry::Host(v6("2001:db8::1")),
                Entry::Subdomains("example.org".into()),
                Entry::Host(name("_srv.x-y.example")),
            ]
        );
        assert_eq!(l.len(), 5);
        assert!(!l.is_empty());
        assert!(l.names(&name("api.example.com")));
        assert!(l.names(&v4([10, 0, 0, 1])));
        assert!(l.names(&v6("2001:db8::1")));
        assert!(!l.names(&v4([10, 0, 0, 2])));
        assert!(!l.names(&v6("2001:db8::2")));
        assert!(!l.names(&name("example.com")));
        assert!(!l.names(&name("x.api.example.com")));
        // An IPv4 entry does not name the same address inside IPv6, nor a name spelled like it.
        assert!(!l.names(&v6("::ffff:10.0.0.1")));
        assert!(!l.names(&name("10.0.0.1")));
        // The long form of an IPv6 address is the same address.
        assert!(list("[2001:db8:0:0:0:0:0:1]\n").names(&v6("2001:db8::1")));
    }

    #[test]
    fn comments_blank_lines_and_surrounding_space_are_ignored() {
        let l = list(
            "# the allowlist\n\n   \n\t# indented comment\n  a.example  \n\tb.example # trailing\nc.example\t#tab then hash\r\n",
        );
        assert_eq!(l.len(), 3);
        for n in ["a.example", "b.example", "c.example"] {
            assert!(l.names(&name(n)), "{n}");
        }
        assert!(list("").is_empty());
        assert!(list("# only comments\n\n").is_empty());
    }

    #[test]
    fn a_hash_not_after_a_space_is_not_a_comment() {
        assert_eq!(
            refused("a.example\nb.example#comment\n"),
            AllowlistError::Line {
                line: 2,
                why: WHY_HASH
            }
        );
    }

    #[test]
    fn a_leading_dot_names_subdomains_not_the_apex() {
        let l = list(".example.com\n");
        assert!(l.names(&name("a.example.com")));
        assert!(l.names(&name("x.y.example.com")));
        assert!(!l.names(&name("example.com")));
        assert!(!l.names(&name("badexample.com")));
        assert!(!l.names(&name("a.example.com.evil")));
        assert!(!l.names(&name("com")));
        // With the apex listed too, both are named.
        let l = list("example.com\n.example.com\n");
        assert!(l.names(&name("example.com")));
        assert!(l.names(&name("a.example.com")));
        // A plain entry does not name subdomains.
        assert!(!list("example.com\n").names(&name("a.example.com")));
        // `Entry::names` agrees with the index.
        let e = Entry::Subdomains("example.com".into());
        assert!(e.names(&name("a.example.com")));
        assert!(!e.names(&name("example.com")));
        assert!(!e.names(&name(".example.com")));
    }

    #[test]
    fn refuses_every_other_line_form_naming_the_line() {
        for (text, why) in [
            ("https://api.example.com", WHY_SCHEME),
            ("http://api.example.com/", WHY_SCHEME),
            ("api.example.com:443", WHY_PORT),
            ("10.0.0.1:8080", WHY_PORT),
            ("[::1]:443", WHY_PORT),
            ("api.example.com/v1", WHY_PATH),
            ("*", WHY_WILDCARD),
            ("*.example.com", WHY_WILDCARD),
            ("API.example.com", WHY_UPPERCASE),
            ("api example.com", WHY_SPACE),
            ("a.example\tb.example", WHY_SPACE),
            (".", WHY_BARE_DOT),
            ("..example.com", WHY_NAME),
            ("example.com.", WHY_NAME),
            ("a..example", WHY_NAME),
            ("-a.example", WHY_NAME),
            ("a-.example", WHY_NAME),
            ("ex!ample.com", WHY_NAME),
            ("exämple.com", WHY_NAME),
            ("a.example:x", WHY_NAME),
            ("example\u{a0}com", WHY_NAME),
            ("127.1", WHY_IPV4),
            ("0x7f.0.0.1", WHY_IPV4),
            ("10.0.0.010", WHY_IPV4),
            ("999.0.0.1", WHY_IPV4),
            ("a.0x1", WHY_IPV4),
            ("::1", WHY_IPV6_BRACKETS),
            ("2001:db8::1", WHY_IPV6_BRACKETS),
            ("[::1", WHY_IPV6),
            ("[not-v6]", WHY_IPV6),
            ("[fe80::1%eth0]", WHY_IPV6),
            ("[::1]x", WHY_IPV6),
            (".10.0.0.1", WHY_SUBDOMAINS),
        ] {
            let err = refused(&format!("# header\nok.example\n{text}\n"));
            assert_eq!(err, AllowlistError::Line { line: 3, why }, "{text:?}");
            assert_eq!(err.line(), 3);
            assert_eq!(err.code(), "allowlist-line-invalid");
            assert!(
                err.to_string()
                    .starts_with("egress-allowlist.conf line 3: ")
            );
        }
        let long_label = format!("{}.example", "a".repeat(64));
        assert_eq!(refused(&long_label).code(), "allowlist-line-invalid");
        let long_name = vec!["a".repeat(63); 4].join("."); // 255 characters
        assert_eq!(
            refused(&long_name),
            AllowlistError::Line {
                line: 1,
                why: WHY_NAME
            }
        );
        let longest = format!("{}.{}", vec!["a".repeat(63); 3].join("."), "a".repeat(61)); // 253
        assert_eq!(list(&longest).len(), 1);
    }

    #[test]
    fn refuses_a_repeated_entry() {
        let err = refused("a.example\n\n[2001:db8::1]\n[2001:db8:0::1]\n");
        assert_eq!(err, AllowlistError::Duplicate { line: 4, first: 3 });
        assert_eq!(err.code(), "allowlist-duplicate");
        assert_eq!(
            refused(".a.example\n.a.example\n"),
            AllowlistError::Duplicate { line: 2, first: 1 }
        );
        // A name and its subdomains are two entries.
        assert_eq!(list("a.example\n.a.example\n").len(), 2);
    }

    #[test]
    fn messages_never_quote_the_line() {
        for text in [
            "https://canary.example",
            "canary.example:443",
            "canary.example/path",
            "*.canary.example",
            "CANARY.example",
            "canary example",
            "canary#x",
            "[canary]",
            "canary.example\ncanary.example",
            "ok.example # canary comment\ncanary!",
        ] {
            let msg = refused(text).to_string().to_lowercase();
            assert!(!msg.contains("canary"), "{text:?}: {msg}");
        }
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            name("localhost"),
            name("a.localhost"),
            name("x.y.localhost"),
            name("LocalHost"),
            name("localhost."),
            v4([127, 0, 0, 1]),
            v4([127, 1, 2, 3]),
            v4([0, 0, 0, 0]),
            v6("::1"),
            v6("::"),
            v6("::ffff:127.0.0.1"),
            v6("::ffff:127.9.9.9"),
            v6("::ffff:0.0.0.0"),
            v6("::127.0.0.1"),
        ] {
            assert!(is_loopback(&h), "{h}");
        }
        for h in [
            name("localhost.example"),
            name("notlocalhost"),
            name("mylocalhost"),
            v4([10, 0, 0, 1]),
            v4([128, 0, 0, 1]),
            v6("2001:db8::1"),
            v6("::ffff:10.0.0.1"),
            v6("::2"),
        ] {
            assert!(!is_loopback(&h), "{h}");
        }
    }

    fn endpoints() -> ModelEndpoints {
        parse_model_endpoints(
            r#"{"version": 1, "endpoints": [
                {"id": "gpu-1", "host": "llm.internal.example", "port": 8000},
                {"id": "tls", "host": "10.0.0.7", "port": 443},
                {"id": "listed", "host": "api.example.com", "port": 8443}
            ]}"#,
        )
        .unwrap()
    }

    fn allow() -> Allowlist {
        list(
            "api.example.com\n.example.org\n10.0.0.9\nlocalhost\n127.0.0.1\n127.1.2.3\n[::1]\n.localhost\n[::ffff:127.0.0.1]\n",
        )
    }

    fn go(scheme: Scheme, host: Host, port: u16) -> Result<Route, Unreachable> {
        route(scheme, &host, port, &allow(), &endpoints())
    }

    #[test]
    fn route_allowlisted_on_https_443_only() {
        assert_eq!(
            go(Scheme::Https, name("api.example.com"), 443),
            Ok(Route::Allowlisted)
        );
        assert_eq!(
            go(Scheme::Https, name("a.example.org"), 443),
            Ok(Route::Allowlisted)
        );
        assert_eq!(
            go(Scheme::Https, v4([10, 0, 0, 9]), 443),
            Ok(Route::Allowlisted)
        );
        // Declared as an endpoint on 8443; on another port than 443 or 8443 it is not reachable.
        assert_eq!(
            go(Scheme::Https, name("api.example.com"), 8443),
            Ok(Route::DeclaredEndpoint {
                id: "listed".into()
            })
        );
        assert_eq!(
            go(Scheme::Https, name("api.example.com"), 8444),
            Err(Unreachable::NotAllowed)
        );
        assert_eq!(
            go(Scheme::Http, name("api.example.com"), 80),
            Err(Unreachable::NotAllowed)
        );
        assert_eq!(
            go(Scheme::Https, name("example.org"), 443),
            Err(Unreachable::NotAllowed)
        );
        assert_eq!(
            go(Scheme::Https, name("other.example"), 443),
            Err(Unreachable::NotAllowed)
        );
    }

    #[test]
    fn route_allowlisted_but_not_declared_on_8443_is_not_allowed() {
        let empty = ModelEndpoints::empty();
        assert_eq!(
            route(
                Scheme::Https,
                &name("api.example.com"),
                8443,
                &allow(),
                &empty
            ),
            Err(Unreachable::NotAllowed)
        );
    }

    #[test]
    fn route_plain_http_on_443_is_always_refused() {
        assert_eq!(
            go(Scheme::Http, name("api.example.com"), 443),
            Err(Unreachable::PlainHttpOn443)
        );
        // Even when an endpoint declares that host on 443.
        assert_eq!(
            go(Scheme::Http, v4([10, 0, 0, 7]), 443),
            Err(Unreachable::PlainHttpOn443)
        );
        assert_eq!(
            go(Scheme::Https, v4([10, 0, 0, 7]), 443),
            Ok(Route::DeclaredEndpoint { id: "tls".into() })
        );
    }

    #[test]
    fn route_declared_endpoint_needs_the_exact_host_and_port() {
        let gpu = Ok(Route::DeclaredEndpoint { id: "gpu-1".into() });
        assert_eq!(go(Scheme::Http, name("llm.internal.example"), 8000), gpu);
        assert_eq!(go(Scheme::Https, name("llm.internal.example"), 8000), gpu);
        assert_eq!(
            go(Scheme::Http, name("llm.internal.example"), 8001),
            Err(Unreachable::NotAllowed)
        );
        assert_eq!(
            go(Scheme::Http, name("x.llm.internal.example"), 8000),
            Err(Unreachable::NotAllowed)
        );
        // Not on the allowlist, so https on 443 to the same host is not reachable either.
        assert_eq!(
            go(Scheme::Https, name("llm.internal.example"), 443),
            Err(Unreachable::NotAllowed)
        );
    }

    #[test]
    fn route_refuses_allowlisted_loopback_hosts() {
        for h in [
            name("localhost"),
            name("a.localhost"),
            v4([127, 0, 0, 1]),
            v4([127, 1, 2, 3]),
            v6("::1"),
            v6("::ffff:127.0.0.1"),
        ] {
            assert_eq!(
                go(Scheme::Https, h.clone(), 443),
                Err(Unreachable::Loopback),
                "{h}"
            );
        }
        // A declared endpoint on the proxy's own machine is reached at exactly its port, and no
        // other port of that host is.
        let own = ModelEndpoints {
            endpoints: vec![Endpoint {
                id: "own".into(),
                host: name("localhost"),
                port: 8000,
                slots: None,
                keyless: false,
            }],
        };
        let at = |scheme, host: Host, port| route(scheme, &host, port, &list("localhost\n"), &own);
        assert_eq!(
            at(Scheme::Http, name("localhost"), 8000),
            Ok(Route::DeclaredEndpoint { id: "own".into() })
        );
        assert_eq!(
            at(Scheme::Https, name("localhost"), 8000),
            Ok(Route::DeclaredEndpoint { id: "own".into() })
        );
        for (scheme, host, port) in [
            (Scheme::Http, name("localhost"), 8001),
            (Scheme::Https, name("localhost"), 443),
            (Scheme::Http, v4([127, 0, 0, 1]), 8000),
        ] {
            assert_eq!(
                at(scheme, host.clone(), port),
                Err(Unreachable::Loopback),
                "{host}:{port}"
            );
        }
    }

    #[test]
    fn unreachable_messages_never_name_the_host() {
        let l = list("canary.localhost\n");
        for (scheme, port) in [
            (Scheme::Http, 443),
            (Scheme::Https, 443),
            (Scheme::Https, 9),
        ] {
            let err = route(
                scheme,
                &name("canary.localhost"),
                port,
                &l,
                &ModelEndpoints::empty(),
            )
            .unwrap_err();
            assert!(!err.to_string().contains("canary"), "{err}");
            assert!(err.code().starts_with("egress-"));
        }
    }

    #[test]
    fn loopback_is_said_first_whatever_the_files_list() {
        let empty = list("");
        for (scheme, host, port) in [
            (Scheme::Https, Host::Name("localhost".into()), 443),
            (Scheme::Http, Host::Name("localhost".into()), 8080),
            (Scheme::Https, Host::Ipv4(Ipv4Addr::LOCALHOST), 8443),
        ] {
            assert_eq!(
                route(scheme, &host, port, &empty, &ModelEndpoints::empty()),
                Err(Unreachable::Loopback)
            );
        }
    }
}
