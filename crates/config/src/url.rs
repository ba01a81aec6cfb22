//! A server's `url`, accepted only in plain form: `http` or `https`, lowercase scheme and host, two
//! slashes, no default port, no user name, password or fragment, references only in the path and as
//! query values (where they are required).
//!
//! This is a small parser of its own rather than a WHATWG one: a WHATWG parser repairs what it reads
//! (it lowercases, drops `:443`, percent-encodes `${`), and the overlay must be refused, never
//! repaired. What it computes instead is the plain form, so the refusal can show the operator what to
//! write.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::reference::{Reference, Template};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// A host as written (lowercase); never holds a reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Name(String),
    Ipv4(Ipv4Addr),
    Ipv6(Ipv6Addr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ipv4(a) => write!(f, "{a}"),
            Host::Ipv6(a) => write!(f, "[{}]", ipv6_text(a)),
        }
    }
}

/// One `name=${NAME}` of the query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryParam {
    pub name: String,
    pub value: Reference,
}

/// A URL in plain form. Its `Display` writes it back exactly as the overlay has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainUrl {
    scheme: Scheme,
    host: Host,
    port: Option<u16>,
    path: Template,
    query: Vec<QueryParam>,
}

impl PlainUrl {
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port a connection goes to: the written one, else the scheme's default.
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(self.scheme.default_port())
    }

    pub fn path(&self) -> &Template {
        &self.path
    }

    pub fn query(&self) -> &[QueryParam] {
        &self.query
    }

    /// Every reference in the path and the query.
    pub fn references(&self) -> impl Iterator<Item = &Reference> {
        self.path
            .references()
            .chain(self.query.iter().map(|q| &q.value))
    }
}

impl fmt::Display for PlainUrl {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}://{}", self.scheme.as_str(), self.host)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        write!(f, "{}", self.path)?;
        for (i, q) in self.query.iter().enumerate() {
            let sep = if i == 0 { '?' } else { '&' };
            write!(f, "{sep}{}={}", q.name, q.value)?;
        }
        Ok(())
    }
}

/// Why a URL is refused. Messages never quote a query value, a user name, a password or a fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlProblem {
    /// Spaces, control characters, backslashes or non-ASCII text: nothing sensible to suggest.
    Characters,
    /// Not `http:` or `https:`.
    Scheme,
    HostMissing,
    HostInvalid,
    /// `${NAME}` in the host: the egress check must read the host before the job starts.
    HostReference,
    PortInvalid,
    PathInvalid,
    /// A `${` in the path or query that is not a well-formed reference.
    MalformedReference,
    QueryInvalid,
    /// A query value that is not a reference; `param` is the parameter's name, when it is a plain one.
    QueryLiteral {
        param: Option<String>,
    },
    Credentials {
        plain: String,
    },
    Fragment {
        plain: String,
    },
    /// Written another way than plainly; `how` says what differs.
    NotPlain {
        how: Vec<&'static str>,
        plain: String,
    },
}

impl UrlProblem {
    pub fn code(&self) -> &'static str {
        match self {
            UrlProblem::Characters | UrlProblem::PathInvalid => "url-invalid",
            UrlProblem::Scheme => "url-scheme",
            UrlProblem::HostMissing | UrlProblem::HostInvalid | UrlProblem::PortInvalid => {
                "url-invalid"
            }
            UrlProblem::HostReference => "url-host-reference",
            UrlProblem::MalformedReference => "reference-malformed",
            UrlProblem::QueryInvalid => "url-invalid",
            UrlProblem::QueryLiteral { .. } => "url-query-literal",
            UrlProblem::Credentials { .. } => "url-credentials",
            UrlProblem::Fragment { .. } => "url-fragment",
            UrlProblem::NotPlain { .. } => "url-not-plain",
        }
    }
}

impl fmt::Display for UrlProblem {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            UrlProblem::Characters => f.write_str(
                "url holds a space, a control character, a backslash or a non-ASCII character",
            ),
            UrlProblem::Scheme => f.write_str("url must start with http:// or https://"),
            UrlProblem::HostMissing => f.write_str("url has no host"),
            UrlProblem::HostInvalid => f.write_str(
                "url's host is not a host name (letters, digits, '-', '.') or an IP address",
            ),
            UrlProblem::HostReference => f.write_str(
                "url's host holds a reference; write the host as is (references may stand in the path and query)",
            ),
            UrlProblem::PortInvalid => f.write_str("url's port is not a number from 1 to 65535"),
            UrlProblem::PathInvalid => f.write_str(
                "url's path holds a character that must be percent-encoded, or a broken percent escape",
            ),
            UrlProblem::MalformedReference => {
                f.write_str("url holds a '${' that is not a reference of the form ${NAME}")
            }
            UrlProblem::QueryInvalid => {
                f.write_str("url's query is not a list of name=${NAME} parameters")
            }
            UrlProblem::QueryLiteral { param: Some(p) } => write!(
                f,
                "url's query parameter '{p}' must have a reference as its value, such as ${{NAME}}"
            ),
            UrlProblem::QueryLiteral { param: None } => {
                f.write_str("url's query values must be references, such as ${NAME}")
            }
            UrlProblem::Credentials { plain } => write!(
                f,
                "url must not hold a user name or password (give the server a token in a header); without them it reads {plain}"
            ),
            UrlProblem::Fragment { plain } => {
                write!(f, "url must not have a fragment ('#...'); without it it reads {plain}")
            }
            UrlProblem::NotPlain { how, plain } => {
                write!(f, "url is not written plainly ({}); write {plain}", how.join(", "))
            }
        }
    }
}

/// A URL cut at its markers (each at its first): the pieces [`parse`] then judges one by one.
struct Pieces<'a> {
    scheme: Scheme,
    credentials: bool,
    host_port: &'a str,
    path: &'a str,
    query: Option<&'a str>,
    fragment: bool,
}

/// Cuts `text` into its pieces, noting in `how` what of the scheme is not written plainly.
fn cut<'a>(text: &'a str, how: &mut Vec<&'static str>) -> Result<Pieces<'a>, UrlProblem> {
    if text
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '\\' || !c.is_ascii())
    {
        return Err(UrlProblem::Characters);
    }
    let (scheme_text, after_scheme) = text.split_once(':').ok_or(UrlProblem::Scheme)?;
    let scheme = match scheme_text.to_ascii_lowercase().as_str() {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        _ => return Err(UrlProblem::Scheme),
    };
    if scheme_text != scheme.as_str() {
        how.push("lowercase scheme");
    }
    let rest = after_scheme.trim_start_matches('/');
    if after_scheme.len() - rest.len() != 2 {
        how.push("two slashes after the scheme");
    }
    // Fragment, then query, then path, then the authority: each split at its first marker.
    let (rest, fragment) = match rest.split_once('#') {
        Some((r, _)) => (r, true),
        None => (rest, false),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (credentials, host_port) = match authority.rsplit_once('@') {
        Some((_, hp)) => (true, hp),
        None => (false, authority),
    };
    Ok(Pieces {
        scheme,
        credentials,
        host_port,
        path,
        query,
        fragment,
    })
}

/// The host and port a URL connects to, as its plain form has them: read by [`parse`]'s own rules
/// for the scheme and the authority, but also for a URL that `parse` refuses only for how it is
/// written (`HTTPS://Host:443/v1`, a trailing dot) or for its path, query, user or fragment. This
/// is the form in which the egress rule ([`crate::egress::route`]) and the declared endpoints
/// compare hosts and ports; `None` when the scheme or the authority itself is not a URL's.
pub fn host_port(text: &str) -> Option<(Host, u16)> {
    let mut how = Vec::new();
    let pieces = cut(text, &mut how).ok()?;
    let (host, port) = parse_host_port(pieces.host_port, pieces.scheme, &mut how).ok()?;
    Some((host, port.unwrap_or(pieces.scheme.default_port())))
}

/// Parses `text` as a server URL; on refusal, every problem found.
pub fn parse(text: &str) -> Result<PlainUrl, Vec<UrlProblem>> {
    let mut problems = Vec::new();
    let mut how: Vec<&'static str> = Vec::new();
    let pieces = cut(text, &mut how).map_err(|p| vec![p])?;
    let (host, port) =
        parse_host_port(pieces.host_port, pieces.scheme, &mut how).unwrap_or_else(|p| {
            problems.push(p);
            (Host::Name(String::new()), None)
        });
    let path = parse_path(pieces.path, &mut how).unwrap_or_else(|p| {
        problems.push(p);
        Template::default()
    });
    let query = pieces
        .query
        .map(|q| parse_query(q, &mut how, &mut problems))
        .unwrap_or_default();
    let structural = problems
        .iter()
        .any(|p| !matches!(p, UrlProblem::QueryLiteral { .. }));
    if structural {
        return Err(problems);
    }
    let url = PlainUrl {
        scheme: pieces.scheme,
        host,
        port,
        path,
        query: query.params,
    };
    let plain = shown_plain(&url, query.redacted);
    problems.extend(written_problems(&pieces, how, plain));
    if problems.is_empty() {
        Ok(url)
    } else {
        Err(problems)
    }
}

/// A URL's query as read: its parameters, and whether a literal value was refused (the plain form
/// then leaves the query out).
#[derive(Default)]
struct Query {
    params: Vec<QueryParam>,
    redacted: bool,
}

/// Reads the query `q` (the text after `?`), keeping each problem once in `problems`.
fn parse_query(q: &str, how: &mut Vec<&'static str>, problems: &mut Vec<UrlProblem>) -> Query {
    let mut query = Query::default();
    if q.is_empty() {
        how.push("no empty query");
        return query;
    }
    for param in q.split('&') {
        match parse_query_param(param) {
            Ok(p) => query.params.push(p),
            Err(p) => {
                if matches!(p, UrlProblem::QueryLiteral { .. }) {
                    query.redacted = true;
                }
                if !problems.contains(&p) {
                    problems.push(p);
                }
            }
        }
    }
    query
}

/// The plain form shown in messages: with a literal query value refused, the query is left out of
/// it rather than quoted.
fn shown_plain(url: &PlainUrl, redacted_query: bool) -> String {
    if redacted_query {
        let without_query = PlainUrl {
            query: Vec::new(),
            ..url.clone()
        };
        format!("{without_query}?…")
    } else {
        url.to_string()
    }
}

/// What is wrong with how a URL is written, beyond what it names: a user or password, a fragment,
/// a form other than the plain one (`how`), each message showing `plain`.
fn written_problems(pieces: &Pieces, how: Vec<&'static str>, plain: String) -> Vec<UrlProblem> {
    let mut problems = Vec::new();
    if pieces.credentials {
        problems.push(UrlProblem::Credentials {
            plain: plain.clone(),
        });
    }
    if pieces.fragment {
        problems.push(UrlProblem::Fragment {
            plain: plain.clone(),
        });
    }
    if !how.is_empty() {
        problems.push(UrlProblem::NotPlain { how, plain });
    }
    problems
}

fn parse_host_port(
    text: &str,
    scheme: Scheme,
    how: &mut Vec<&'static str>,
) -> Result<(Host, Option<u16>), UrlProblem> {
    if text.contains("${") {
        return Err(UrlProblem::HostReference);
    }
    let (host_text, port_text) = split_host_port(text)?;
    if host_text.is_empty() {
        return Err(UrlProblem::HostMissing);
    }
    let port = match port_text {
        None => None,
        Some(p) => parse_port(p, scheme, how)?,
    };
    Ok((parse_host(host_text, how)?, port))
}

/// The host (an IPv6 address with its brackets) and the port's text after `:`, if any.
fn split_host_port(text: &str) -> Result<(&str, Option<&str>), UrlProblem> {
    let Some(after_bracket) = text.strip_prefix('[') else {
        return Ok(match text.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        });
    };
    let (inside, after) = after_bracket
        .split_once(']')
        .ok_or(UrlProblem::HostInvalid)?;
    let port = match after {
        "" => None,
        p => Some(p.strip_prefix(':').ok_or(UrlProblem::HostInvalid)?),
    };
    Ok((&text[..inside.len() + 2], port))
}

/// The port written after `:`: `None` when it is empty or the scheme's own (noted in `how`).
fn parse_port(
    text: &str,
    scheme: Scheme,
    how: &mut Vec<&'static str>,
) -> Result<Option<u16>, UrlProblem> {
    if text.is_empty() {
        how.push("no empty port");
        return Ok(None);
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(UrlProblem::PortInvalid);
    }
    let n: u16 = text.parse().map_err(|_| UrlProblem::PortInvalid)?;
    if n == 0 {
        return Err(UrlProblem::PortInvalid);
    }
    if text.starts_with('0') {
        how.push("no leading zero in the port");
    }
    if n == scheme.default_port() {
        how.push("no default port");
        Ok(None)
    } else {
        Ok(Some(n))
    }
}

/// The host: an IPv6 address in brackets or a host name, noting in `how` what of it is not
/// written plainly.
fn parse_host(text: &str, how: &mut Vec<&'static str>) -> Result<Host, UrlProblem> {
    let lower = text.to_ascii_lowercase();
    if lower != text {
        how.push("lowercase host");
    }
    if let Some(inside) = lower.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        let addr: Ipv6Addr = inside.parse().map_err(|_| UrlProblem::HostInvalid)?;
        if ipv6_text(&addr) != inside {
            how.push("the IPv6 address in its short form");
        }
        return Ok(Host::Ipv6(addr));
    }
    let mut name = lower.as_str();
    if let Some(n) = name.strip_suffix('.') {
        how.push("no trailing dot in the host");
        name = n;
    }
    parse_host_name(name).map_err(|_| UrlProblem::HostInvalid)
}

/// An IPv6 address as a browser writes it: lowercase hex groups, the first longest run of two or
/// more zero groups as `::`, and never a dotted IPv4 tail (`::ffff:7f00:1`, not `::ffff:127.0.0.1`).
fn ipv6_text(addr: &Ipv6Addr) -> String {
    let groups = addr.segments();
    let (mut best, mut run) = ((0, 0), (0, 0));
    for (i, g) in groups.iter().enumerate() {
        if *g == 0 {
            run = if run.1 == 0 {
                (i, 1)
            } else {
                (run.0, run.1 + 1)
            };
            if run.1 > best.1 {
                best = run;
            }
        } else {
            run = (0, 0);
        }
    }
    let hex = |gs: &[u16]| {
        gs.iter()
            .map(|g| format!("{g:x}"))
            .collect::<Vec<_>>()
            .join(":")
    };
    if best.1 < 2 {
        return hex(&groups);
    }
    format!(
        "{}::{}",
        hex(&groups[..best.0]),
        hex(&groups[best.0 + best.1..])
    )
}

/// Why a host name is refused, for callers that explain it in their own words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostNameError {
    /// Not labels of lowercase letters, digits, `-` and `_` (at most 63 each, 253 in all).
    Name,
    /// It ends in a number, so a browser reads it as an IPv4 address, but it is not a dotted one.
    Ipv4,
}

/// Whether `host` is the proxy's own machine: `localhost` and names under `.localhost`, IPv4
/// 127.0.0.0/8 and 0.0.0.0, IPv6 `::1` and `::`, and those IPv4 addresses inside IPv6 (mapped, as
/// `::ffff:127.0.0.1`, or the older compatible form `::127.0.0.1`). Names are never looked up.
pub fn is_loopback(host: &Host) -> bool {
    let v4 = |a: &Ipv4Addr| a.is_loopback() || a.is_unspecified();
    match host {
        Host::Name(n) => {
            // Hosts are lowercase and have no trailing dot, but this guards the proxy: be lenient
            // in what counts as loopback.
            let n = n.strip_suffix('.').unwrap_or(n).to_ascii_lowercase();
            n == "localhost" || n.ends_with(".localhost")
        }
        Host::Ipv4(a) => v4(a),
        Host::Ipv6(a) => {
            a.is_loopback() || a.is_unspecified() || a.to_ipv4().is_some_and(|m| v4(&m))
        }
    }
}

/// A lowercase DNS name or a dotted IPv4 address: the one rule for hosts, shared by URLs, the egress
/// allowlist and the model endpoints.
pub(crate) fn parse_host_name(name: &str) -> Result<Host, HostNameError> {
    let labels: Vec<&str> = name.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !labels.iter().all(label_ok) {
        return Err(HostNameError::Name);
    }
    // A name whose last label is a number (decimal, or `0x` hex) is an IPv4 address to a browser,
    // and must be written as one in dotted form: `127.1`, `0x7f.0.0.1` and `127.0.0.0x1` all reach
    // loopback past a reader that takes them for names.
    let ends_in_number = labels.last().is_some_and(|l| {
        l.bytes().all(|b| b.is_ascii_digit())
            || l.strip_prefix("0x")
                .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
    });
    if ends_in_number {
        return name
            .parse()
            .map(Host::Ipv4)
            .map_err(|_| HostNameError::Ipv4);
    }
    Ok(Host::Name(name.to_owned()))
}

/// The printable ASCII a browser leaves as written in a path: RFC 3986's `pchar` and `/`, plus `|`,
/// `^`, `[` and `]`. `%` is checked on its own; space, `"`, `<`, `>`, `` ` ``, `{` and `}` must be
/// percent-encoded (`{` and `}` stand only in references).
fn path_char_ok(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/|^[]".contains(&b)
}

fn parse_path(text: &str, how: &mut Vec<&'static str>) -> Result<Template, UrlProblem> {
    let template = Template::parse(text).map_err(|_| UrlProblem::MalformedReference)?;
    for part in template.parts() {
        if let crate::reference::Part::Literal(l) = part {
            check_escaped_text(l, path_char_ok).map_err(|_| UrlProblem::PathInvalid)?;
        }
    }
    let segments: Vec<&str> = text.split('/').skip(1).collect();
    if segments
        .iter()
        .any(|s| is_single_dot(s) || is_double_dot(s))
    {
        how.push("no '.' or '..' path segment");
        let resolved = remove_dot_segments(&segments);
        return Template::parse(&resolved).map_err(|_| UrlProblem::MalformedReference);
    }
    Ok(template)
}

/// `.`, or its percent-encoded spelling, which a browser resolves the same way.
fn is_single_dot(segment: &str) -> bool {
    segment == "." || segment.eq_ignore_ascii_case("%2e")
}

/// `..`, or a spelling of it with one or both dots percent-encoded.
fn is_double_dot(segment: &str) -> bool {
    let s = segment.to_ascii_lowercase();
    matches!(s.as_str(), ".." | ".%2e" | "%2e." | "%2e%2e")
}

/// Resolves `.` and `..` segments the way a browser does before it shows a URL.
fn remove_dot_segments(segments: &[&str]) -> String {
    let mut out: Vec<&str> = Vec::new();
    for (i, s) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        if is_double_dot(s) {
            out.pop();
        }
        if is_single_dot(s) || is_double_dot(s) {
            if last {
                out.push("");
            }
        } else {
            out.push(s);
        }
    }
    let mut path = String::new();
    for s in out {
        path.push('/');
        path.push_str(s);
    }
    path
}

/// Every byte allowed by `ok`, and every `%` followed by two hex digits.
fn check_escaped_text(text: &str, ok: fn(u8) -> bool) -> Result<(), ()> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or(())?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return Err(());
            }
            i += 3;
        } else if ok(bytes[i]) {
            i += 1;
        } else {
            return Err(());
        }
    }
    Ok(())
}

fn query_name_char_ok(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~".contains(&b)
}

fn parse_query_param(param: &str) -> Result<QueryParam, UrlProblem> {
    if param.is_empty() {
        return Err(UrlProblem::QueryInvalid);
    }
    let Some((name, value)) = param.split_once('=') else {
        // A bare `?token` could itself be a credential: refused, and never quoted.
        return Err(UrlProblem::QueryLiteral { param: None });
    };
    if name.is_empty()
        || name.contains("${")
        || check_escaped_text(name, query_name_char_ok).is_err()
    {
        return Err(UrlProblem::QueryInvalid);
    }
    let value = Reference::parse_whole(value).ok_or_else(|| UrlProblem::QueryLiteral {
        param: Some(name.to_owned()),
    })?;
    Ok(QueryParam {
        name: name.to_owned(),
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(text: &str) -> PlainUrl {
        match parse(text) {
            Ok(u) => u,
            Err(p) => panic!("{text}: {p:?}"),
        }
    }

    fn problems(text: &str) -> Vec<UrlProblem> {
        match parse(text) {
            Ok(u) => panic!("{text} accepted as {u}"),
            Err(p) => p,
        }
    }

    fn suggested(text: &str) -> String {
        let ps = problems(text);
        match ps.as_slice() {
            [UrlProblem::NotPlain { plain, .. }] => plain.clone(),
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn accepts_plain_urls_and_writes_them_back_unchanged() {
        for text in [
            "https://mcp.example.com/mcp",
            "https://mcp.example.com",
            "https://mcp.example.com/",
            "http://localhost:8080/mcp",
            "https://h.example:8443/a/b;c=d/~e",
            "https://actions.example.com/mcp/${ZAP_KEY}/sse",
            "https://h/mcp?api_key=${KEY}",
            "https://h/mcp?a=${A}&b=${B}",
            "http://127.0.0.1:3000/mcp",
            "http://[::1]:3000/mcp",
            "https://h/a%20b",
            "https://h/a|b^c[d]",
            "https://0x.example.com/",
            "http://[2001:db8::1:0:0:1]/",
            "http://[2001:db8:0:1:1:1:1:1]/",
            "http://h:443/mcp",
            "https://h:80/mcp",
        ] {
            assert_eq!(plain(text).to_string(), text);
        }
    }

    #[test]
    fn host_port_reads_the_plain_form_of_a_url_written_another_way() {
        let llm = Some((Host::Name("llm.example.com".into()), 443));
        for text in [
            "https://llm.example.com/v1",
            "https://llm.example.com:443/v1",
            "HTTPS://LLM.Example.com/v1",
            "Https://llm.EXAMPLE.com:0443/v1",
            "https:/llm.example.com./v1",
            "https://llm.example.com/v1?key=$KEY",
            "https://u:p@llm.example.com/v1#f",
        ] {
            assert_eq!(host_port(text), llm, "{text}");
        }
        assert_eq!(
            host_port("http://[0:0:0:0:0:0:0:1]:8000/v1"),
            Some((Host::Ipv6(Ipv6Addr::LOCALHOST), 8000))
        );
        assert_eq!(
            host_port("HTTP://LLM.example.com:80/v1"),
            Some((Host::Name("llm.example.com".into()), 80))
        );
        // Not a host and port a connection could go to.
        for text in [
            "ftp://h/v1",
            "https://${H}/v1",
            "https://h:x/v1",
            "https://",
            "h/v1",
        ] {
            assert_eq!(host_port(text), None, "{text}");
        }
    }

    #[test]
    fn reads_host_port_and_references() {
        let u = plain("https://Docs.example.com/x".to_lowercase().as_str());
        assert_eq!(u.host(), &Host::Name("docs.example.com".into()));
        assert_eq!(u.port(), 443);
        assert_eq!(plain("http://h/x").port(), 80);
        assert_eq!(plain("http://h:9000/x").port(), 9000);
        let refs: Vec<String> = plain("https://h/p/${A}/q?k=${B}")
            .references()
            .map(|r| r.name().to_string())
            .collect();
        assert_eq!(refs, ["A", "B"]);
        assert_eq!(
            plain("http://127.0.0.1/").host(),
            &Host::Ipv4(Ipv4Addr::LOCALHOST)
        );
    }

    #[test]
    fn shows_the_plain_form_of_a_url_written_another_way() {
        assert_eq!(
            suggested("HTTPS://mcp.example.com/mcp"),
            "https://mcp.example.com/mcp"
        );
        assert_eq!(
            suggested("https://MCP.Example.com/mcp"),
            "https://mcp.example.com/mcp"
        );
        assert_eq!(
            suggested("https://mcp.example.com:443/mcp"),
            "https://mcp.example.com/mcp"
        );
        assert_eq!(
            suggested("http://mcp.example.com:80/mcp"),
            "http://mcp.example.com/mcp"
        );
        assert_eq!(
            suggested("https:/mcp.example.com/mcp"),
            "https://mcp.example.com/mcp"
        );
        assert_eq!(
            suggested("https:///mcp.example.com/mcp"),
            "https://mcp.example.com/mcp"
        );
        assert_eq!(
            suggested("https:mcp.example.com"),
            "https://mcp.example.com"
        );
        assert_eq!(suggested("https://h:/mcp"), "https://h/mcp");
        assert_eq!(suggested("https://h:0443/mcp"), "https://h/mcp");
        assert_eq!(suggested("https://h./mcp"), "https://h/mcp");
        assert_eq!(suggested("https://h/a/../b/./c"), "https://h/b/c");
        assert_eq!(suggested("https://h/mcp?"), "https://h/mcp");
        assert_eq!(
            suggested("http://[0:0:0:0:0:0:0:1]:3000/"),
            "http://[::1]:3000/"
        );
    }

    #[test]
    fn refuses_schemes_other_than_http_and_https() {
        for text in [
            "ftp://h/x",
            "ws://h/mcp",
            "file:///etc/passwd",
            "mcp.example.com/mcp",
            "",
        ] {
            assert_eq!(problems(text), [UrlProblem::Scheme], "{text}");
        }
    }

    #[test]
    fn refuses_credentials_and_fragments_without_quoting_them() {
        let ps = problems("https://user:canary-pass@h.example/mcp");
        assert_eq!(ps.len(), 1);
        assert_eq!(ps[0].code(), "url-credentials");
        assert!(ps[0].to_string().contains("https://h.example/mcp"));
        assert!(!ps[0].to_string().contains("canary"));

        let ps = problems("https://h.example/mcp#token=canary");
        assert_eq!(ps[0].code(), "url-fragment");
        assert!(ps[0].to_string().contains("https://h.example/mcp"));
        assert!(!ps[0].to_string().contains("canary"));
    }

    #[test]
    fn query_values_are_always_references() {
        let ps = problems("https://h/mcp?api_key=canary-123");
        assert_eq!(
            ps,
            [UrlProblem::QueryLiteral {
                param: Some("api_key".into())
            }]
        );
        assert!(!ps[0].to_string().contains("canary"));
        // A bare parameter might be a key itself; refused and never quoted.
        let ps = problems("https://h/mcp?canary-123");
        assert_eq!(ps, [UrlProblem::QueryLiteral { param: None }]);
        // Partly a reference is not a reference.
        assert_eq!(
            problems("https://h/?k=x${A}")[0].code(),
            "url-query-literal"
        );
        // With one parameter refused, the suggestion leaves the whole query out.
        let ps = problems("HTTPS://h/mcp?a=${A}&b=lit");
        let plain = ps
            .iter()
            .find(|p| p.code() == "url-not-plain")
            .unwrap()
            .to_string();
        assert!(plain.ends_with("write https://h/mcp?…"), "{plain}");
        // The plain form in another message leaves the literal query out.
        let ps = problems("HTTPS://h/mcp?k=canary-9");
        let text: String = ps.iter().map(|p| p.to_string()).collect();
        assert!(!text.contains("canary"), "{text}");
        assert!(ps.iter().any(|p| p.code() == "url-not-plain"));
    }

    #[test]
    fn every_problem_of_a_url_is_reported_in_order() {
        use UrlProblem::{
            Credentials, Fragment, MalformedReference, NotPlain, PortInvalid, QueryInvalid,
            QueryLiteral,
        };
        let k = || QueryLiteral {
            param: Some("k".into()),
        };
        assert_eq!(
            problems("HTTPS://u@H.example:0443/a/../b?k=lit&j=${J}&k=lit&=x#f"),
            [k(), QueryInvalid]
        );
        let redacted = "https://h.example/b?…".to_owned();
        assert_eq!(
            problems("HTTPS://u@H.example:0443/a/../b?k=lit&j=${J}&k=lit#f"),
            [
                k(),
                Credentials {
                    plain: redacted.clone()
                },
                Fragment {
                    plain: redacted.clone()
                },
                NotPlain {
                    how: vec![
                        "lowercase scheme",
                        "no leading zero in the port",
                        "no default port",
                        "lowercase host",
                        "no '.' or '..' path segment",
                    ],
                    plain: redacted,
                },
            ]
        );
        let plain = "https://h.example/x?a=${A}".to_owned();
        assert_eq!(
            problems("https://u:p@h.example/x?a=${A}#f"),
            [
                Credentials {
                    plain: plain.clone()
                },
                Fragment { plain }
            ]
        );
        assert_eq!(
            problems("http://h:8o/${bad}?a=lit"),
            [
                PortInvalid,
                MalformedReference,
                QueryLiteral {
                    param: Some("a".into())
                }
            ]
        );
        assert_eq!(
            problems("HTTP://[0:0:0:0:0:0:0:1]:80/?a=${A}&b=${B}"),
            [NotPlain {
                how: vec![
                    "lowercase scheme",
                    "no default port",
                    "the IPv6 address in its short form"
                ],
                plain: "http://[::1]/?a=${A}&b=${B}".to_owned(),
            }]
        );
    }

    #[test]
    fn references_never_stand_in_the_host_or_port() {
        assert_eq!(problems("https://${HOST}/mcp"), [UrlProblem::HostReference]);
        assert_eq!(
            problems("https://${HOST}.example.com/mcp"),
            [UrlProblem::HostReference]
        );
        assert_eq!(
            problems("https://h:${PORT}/mcp"),
            [UrlProblem::HostReference]
        );
        assert_eq!(
            problems("https://h/${bad}"),
            [UrlProblem::MalformedReference]
        );
        assert_eq!(problems("https://h/?${K}=${V}"), [UrlProblem::QueryInvalid]);
    }

    #[test]
    fn refuses_broken_hosts_ports_and_paths() {
        for (text, code) in [
            ("https:///", "url-invalid"),
            ("https://h:99999/", "url-invalid"),
            ("https://h:0/", "url-invalid"),
            ("https://h:8o/", "url-invalid"),
            ("https://-h/", "url-invalid"),
            ("https://a..b/", "url-invalid"),
            ("https://h%41/", "url-invalid"),
            ("https://127.1/", "url-invalid"),
            ("https://127.0.0.0x1/", "url-invalid"),
            ("https://a.0x1/", "url-invalid"),
            ("https://a.0X1/", "url-invalid"),
            ("https://10.0.0.010/", "url-invalid"),
            ("https://0x7f.0.0.1/", "url-invalid"),
            ("https://999.0.0.1/", "url-invalid"),
            ("https://[::1/", "url-invalid"),
            ("https://[fe80::1%25eth0]/", "url-invalid"),
            ("https://h/a b", "url-invalid"),
            ("https://h/a\\b", "url-invalid"),
            ("https://h/é", "url-invalid"),
            ("https://h/a<b", "url-invalid"),
            ("https://h/a%2", "url-invalid"),
            ("https://h/a%zz", "url-invalid"),
            ("https://h/mcp?a=${A}&&b=${B}", "url-invalid"),
        ] {
            let ps = problems(text);
            assert!(ps.iter().any(|p| p.code() == code), "{text}: {ps:?}");
        }
    }
}
