//! What the proxy decides, as pure functions: the target a request names, the rule of
//! [`config::egress::route`] (the one the pickup gate and doctor predict with), then the addresses a
//! name resolved to. Nothing here touches the network.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use config::egress::{Allowlist, Route, Unreachable, route};
use config::endpoints::ModelEndpoints;
use config::url::{self, Host, Scheme};

/// The files the proxy enforces, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    pub allowlist: Allowlist,
    pub endpoints: ModelEndpoints,
}

/// What a request asks to reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `Https` for CONNECT (a tunnel, whatever runs inside it), `Http` for a plain request.
    pub scheme: Scheme,
    pub host: Host,
    pub port: u16,
}

/// Why the proxy refused. Each has a stable code, for its log line, its answer and the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Denial {
    /// Neither allowlisted (on 443) nor a declared endpoint's host and port.
    NotAllowed,
    /// Plain http to port 443.
    PlainHttpOn443,
    /// The host is the proxy's own machine by its name or address (loopback, `localhost`).
    Loopback,
    /// An allowlisted name that is this machine's own name or resolves to one of its addresses.
    OwnMachine,
    /// An allowlisted name that resolves to an address no job reaches: loopback, link-local,
    /// unspecified or multicast (IPv4 or IPv6).
    SpecialAddress,
    /// The name did not resolve.
    Unresolved,
    /// The allowlist or the endpoints file cannot be read: everything is refused until it can.
    RulesUnreadable,
}

impl Denial {
    pub fn code(self) -> &'static str {
        match self {
            Denial::NotAllowed => "not-allowed",
            Denial::PlainHttpOn443 => "plain-http-443",
            Denial::Loopback => "loopback",
            Denial::OwnMachine => "own-machine",
            Denial::SpecialAddress => "special-address",
            Denial::Unresolved => "unresolved",
            Denial::RulesUnreadable => "rules-unreadable",
        }
    }
}

impl From<Unreachable> for Denial {
    fn from(u: Unreachable) -> Self {
        match u {
            Unreachable::PlainHttpOn443 => Denial::PlainHttpOn443,
            Unreachable::Loopback => Denial::Loopback,
            Unreachable::NotAllowed => Denial::NotAllowed,
        }
    }
}

/// Reads a CONNECT request's target, `host:port` (a port is required; an IPv6 address in
/// brackets). `None` for anything else: a user, a path, a missing or zero port.
pub fn connect_target(authority: &str) -> Option<Target> {
    if authority.is_empty() || authority.contains(['@', '/', '?', '#', '\\', ' ']) {
        return None;
    }
    let (_, port) = authority.rsplit_once(':')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (host, port) = url::host_port(&format!("https://{authority}"))?;
    (port != 0).then_some(Target {
        scheme: Scheme::Https,
        host,
        port,
    })
}

/// Reads a plain request's absolute-form target, `http://host[:port]/…`. `None` for any other form
/// (`https://` in the clear included: the proxy never terminates TLS).
pub fn plain_target(uri: &str) -> Option<Target> {
    uri.get(..7).filter(|s| s.eq_ignore_ascii_case("http://"))?;
    let authority_end = uri[7..].find(['/', '?', '#']).map_or(uri.len(), |i| i + 7);
    let authority = &uri[7..authority_end];
    if authority.is_empty() || authority.contains(['@', '\\', ' ']) {
        return None;
    }
    let (host, port) = url::host_port(&format!("http://{authority}"))?;
    (port != 0).then_some(Target {
        scheme: Scheme::Http,
        host,
        port,
    })
}

/// The rule before any lookup: the route, or why not.
pub fn judge(target: &Target, rules: &Rules) -> Result<Route, Denial> {
    route(
        target.scheme,
        &target.host,
        target.port,
        &rules.allowlist,
        &rules.endpoints,
    )
    .map_err(Denial::from)
}

/// What the proxy knows of its own machine: its host name and the addresses of its interfaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnMachine {
    pub names: Vec<String>,
    pub addresses: Vec<IpAddr>,
}

impl OwnMachine {
    pub fn is_own_name(&self, host: &Host) -> bool {
        match host {
            Host::Name(n) => self.names.iter().any(|own| own.eq_ignore_ascii_case(n)),
            Host::Ipv4(a) => self.addresses.contains(&IpAddr::V4(*a)),
            Host::Ipv6(a) => self.addresses.contains(&IpAddr::V6(*a)),
        }
    }
}

/// The addresses a routed target may be connected to, checked once: the caller connects to exactly
/// these. A declared endpoint is the operator's exact host and port, on this machine or not, so its
/// addresses are taken as they are; an allowlisted host is refused if any of its addresses is this
/// machine's or is not a real peer's ([`is_special`]), so that one bad answer among good ones cannot
/// be picked by a retry.
pub fn addresses_for(
    route: &Route,
    target: &Target,
    resolved: &[IpAddr],
    own: &OwnMachine,
) -> Result<Vec<IpAddr>, Denial> {
    if resolved.is_empty() {
        return Err(Denial::Unresolved);
    }
    if let Route::Allowlisted = route {
        if own.is_own_name(&target.host) {
            return Err(Denial::OwnMachine);
        }
        if resolved.iter().any(is_special) {
            return Err(Denial::SpecialAddress);
        }
        if resolved
            .iter()
            .any(|a| own.addresses.contains(&canonical(*a)))
        {
            return Err(Denial::OwnMachine);
        }
    }
    let mut out: Vec<IpAddr> = Vec::with_capacity(resolved.len());
    for a in resolved.iter().map(|a| canonical(*a)) {
        if !out.contains(&a) {
            out.push(a);
        }
    }
    Ok(out)
}

/// An IPv4 address inside IPv6 (mapped `::ffff:a.b.c.d`) as the IPv4 address it is.
pub fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Loopback, link-local, unspecified (and the rest of 0.0.0.0/8), broadcast or multicast, in IPv4
/// or IPv6 (an IPv4 address mapped or compatible inside IPv6 judged as itself).
pub fn is_special(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

fn special_v4(a: &Ipv4Addr) -> bool {
    a.is_loopback()
        || a.is_link_local()
        || a.is_unspecified()
        || a.octets()[0] == 0
        || a.is_broadcast()
        || a.is_multicast()
}

fn special_v6(a: &Ipv6Addr) -> bool {
    let seg0 = a.segments()[0];
    if a.is_loopback() || a.is_unspecified() || a.is_multicast() {
        return true;
    }
    // fe80::/10, link-local unicast.
    if seg0 & 0xffc0 == 0xfe80 {
        return true;
    }
    // Mapped (::ffff:a.b.c.d) or the older compatible form (::a.b.c.d).
    a.to_ipv4().is_some_and(|v4| special_v4(&v4))
}

#[cfg(test)]
mod tests {
    use super::*;
    use config::egress::parse_allowlist;
    use config::endpoints::parse_model_endpoints;

    fn rules(allow: &str, endpoints: &str) -> Rules {
        Rules {
            allowlist: parse_allowlist(allow).unwrap(),
            endpoints: if endpoints.is_empty() {
                ModelEndpoints::empty()
            } else {
                parse_model_endpoints(endpoints).unwrap()
            },
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn reads_connect_and_plain_targets() {
        let t = connect_target("api.example.com:443").unwrap();
        assert_eq!(t.host, Host::Name("api.example.com".into()));
        assert_eq!((t.scheme, t.port), (Scheme::Https, 443));
        // Written another way, the same host: case and a trailing dot do not make a new name.
        assert_eq!(connect_target("API.Example.com.:443").unwrap().host, t.host);
        let v6 = connect_target("[2001:db8::1]:443").unwrap();
        assert_eq!(v6.host, Host::Ipv6("2001:db8::1".parse().unwrap()));
        for bad in [
            "api.example.com",
            "api.example.com:",
            "api.example.com:0",
            "api.example.com:99999",
            "u@api.example.com:443",
            "api.example.com:443/x",
            "127.1:443",
            "",
            ":443",
        ] {
            assert_eq!(connect_target(bad), None, "{bad}");
        }
        let p = plain_target("http://llm.internal:8000/v1/chat?x=1").unwrap();
        assert_eq!((p.scheme, p.port), (Scheme::Http, 8000));
        assert_eq!(plain_target("http://a.example/").unwrap().port, 80);
        assert_eq!(plain_target("HTTP://a.example").unwrap().port, 80);
        for bad in [
            "https://a.example/",
            "/v1/models",
            "a.example:80",
            "http://u@a.example/",
        ] {
            assert_eq!(plain_target(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_route_is_configs_and_the_addresses_are_checked_once() {
        let r = rules(
            "api.example.com\n.svc.example\n10.0.0.9\n",
            r#"{"version":1,"endpoints":[{"id":"own","host":"127.0.0.1","port":8000},{"id":"gpu","host":"llm.internal","port":9000}]}"#,
        );
        let own = OwnMachine {
            names: vec!["worker-1".into()],
            addresses: vec![ip("127.0.0.1"), ip("192.0.2.7")],
        };
        let go = |authority: &str, resolved: &[&str]| {
            let t = connect_target(authority).unwrap();
            let resolved: Vec<IpAddr> = resolved.iter().map(|s| ip(s)).collect();
            judge(&t, &r).and_then(|route| addresses_for(&route, &t, &resolved, &own))
        };
        assert_eq!(
            go("api.example.com:443", &["198.51.100.1"]),
            Ok(vec![ip("198.51.100.1")])
        );
        assert_eq!(
            go("a.svc.example:443", &["198.51.100.2"]),
            Ok(vec![ip("198.51.100.2")])
        );
        assert_eq!(
            go("api.example.com:8443", &["198.51.100.1"]),
            Err(Denial::NotAllowed)
        );
        assert_eq!(
            go("other.example:443", &["198.51.100.1"]),
            Err(Denial::NotAllowed)
        );
        assert_eq!(
            go("api.example.com:443", &["127.0.0.1"]),
            Err(Denial::SpecialAddress)
        );
        assert_eq!(
            go("api.example.com:443", &["198.51.100.1", "::1"]),
            Err(Denial::SpecialAddress)
        );
        for special in [
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::",
        ] {
            assert_eq!(
                go("api.example.com:443", &[special]),
                Err(Denial::SpecialAddress),
                "{special}"
            );
        }
        assert_eq!(
            go("api.example.com:443", &["192.0.2.7"]),
            Err(Denial::OwnMachine)
        );
        assert_eq!(go("api.example.com:443", &[]), Err(Denial::Unresolved));
        // A raw address only when listed.
        assert_eq!(go("10.0.0.9:443", &["10.0.0.9"]), Ok(vec![ip("10.0.0.9")]));
        assert_eq!(go("10.0.0.8:443", &["10.0.0.8"]), Err(Denial::NotAllowed));
        // A declared endpoint: its exact port, on this machine too, and nothing next to it.
        assert_eq!(
            go("127.0.0.1:8000", &["127.0.0.1"]),
            Ok(vec![ip("127.0.0.1")])
        );
        assert_eq!(go("127.0.0.1:8001", &["127.0.0.1"]), Err(Denial::Loopback));
        assert_eq!(go("localhost:8000", &["127.0.0.1"]), Err(Denial::Loopback));
        assert_eq!(
            go("llm.internal:9000", &["10.1.1.1"]),
            Ok(vec![ip("10.1.1.1")])
        );
        assert_eq!(
            go("llm.internal:9001", &["10.1.1.1"]),
            Err(Denial::NotAllowed)
        );
        // Plain http: only a declared endpoint; never port 443.
        let plain = |uri: &str| {
            let t = plain_target(uri).unwrap();
            judge(&t, &r)
        };
        assert!(plain("http://127.0.0.1:8000/v1/models").is_ok());
        assert_eq!(plain("http://api.example.com/"), Err(Denial::NotAllowed));
        assert_eq!(
            plain("http://api.example.com:443/"),
            Err(Denial::PlainHttpOn443)
        );
    }

    #[test]
    fn special_addresses() {
        for s in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "0.1.2.3",
            "169.254.1.1",
            "255.255.255.255",
            "239.1.1.1",
            "::1",
            "::",
            "fe80::1",
            "febf::1",
            "ff05::2",
            "::ffff:169.254.1.1",
            "::127.0.0.1",
        ] {
            assert!(is_special(&ip(s)), "{s}");
        }
        for s in [
            "10.0.0.1",
            "192.168.1.1",
            "198.51.100.1",
            "2001:db8::1",
            "fd00::1",
            "::ffff:10.0.0.1",
            "fec0::1",
        ] {
            assert!(!is_special(&ip(s)), "{s}");
        }
    }
}
