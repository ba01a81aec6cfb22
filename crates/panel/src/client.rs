//! Who is asking: the client's address (the peer's, or the one a proxy the operator trusts says it
//! forwarded for), whether it reached the panel over TLS, and whether a form it posts comes from
//! the panel's own pages.
//!
//! The panel serves plain HTTP; TLS is a proxy's (docs/panel.md). A proxy named in
//! `PI_PANEL_TRUSTED_PROXIES` is believed about the client (the last address of
//! `X-Forwarded-For`, the one it added) and about TLS (`X-Forwarded-Proto: https`); what any other
//! peer says of itself in those headers is ignored.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};

use crate::Panel;

/// The setting naming the proxies the panel believes about the client (IP addresses, by commas).
pub const TRUSTED_PROXIES_SETTING: &str = "PI_PANEL_TRUSTED_PROXIES";

/// The client of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// Its address, as the throttle counts it: an IPv6 address by its /64 (one host's share).
    pub key: IpAddr,
    /// Reached over TLS (through a trusted proxy that says so).
    pub tls: bool,
}

/// The trusted proxies' addresses in `PI_PANEL_TRUSTED_PROXIES`; the entry that is not an IP
/// address, by its position, when one is not.
pub fn trusted_proxies(value: &str) -> Result<Vec<IpAddr>, usize> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, s)| s.parse::<IpAddr>().map_err(|_| i + 1))
        .collect()
}

/// An address as the throttle keys it.
fn keyed(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

/// The client of a request from `peer` with `headers`, believing `trusted` proxies only. Pure.
pub fn client_of(peer: IpAddr, headers: &HeaderMap, trusted: &[IpAddr]) -> Client {
    let peer = keyed(peer);
    if !trusted.iter().any(|t| keyed(*t) == peer) {
        return Client {
            key: peer,
            tls: false,
        };
    }
    let forwarded_for = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .next_back();
    let tls = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("https"));
    Client {
        key: forwarded_for.map_or(peer, keyed),
        tls,
    }
}

/// Whether a form posted with `headers` comes from the panel's own pages: its `Origin` (or, without
/// one, its `Referer`) names the host the request was sent to. A request with neither (a client
/// that is no browser) passes: a browser names the page a cross-site form was posted from.
pub fn same_site(headers: &HeaderMap) -> bool {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase);
    let from = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .and_then(|v| v.to_str().ok());
    let Some(from) = from else {
        return true;
    };
    let authority = from
        .split_once("://")
        .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or_default())
        .map(str::to_ascii_lowercase);
    matches!((authority, host), (Some(a), Some(h)) if !a.is_empty() && a == h)
}

impl FromRequestParts<Arc<Panel>> for Client {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        panel: &Arc<Panel>,
    ) -> Result<Client, Self::Rejection> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
        Ok(client_of(peer, &parts.headers, &panel.trusted_proxies))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_a_trusted_proxy_is_believed_about_the_client_and_tls() {
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        let said = headers(&[
            ("x-forwarded-for", "203.0.113.9, 198.51.100.7"),
            ("x-forwarded-proto", "https"),
        ]);
        let c = client_of(proxy, &said, &[proxy]);
        assert_eq!(c.key, "198.51.100.7".parse::<IpAddr>().unwrap());
        assert!(c.tls);
        // Any other peer is itself, whatever it says.
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(
            client_of(other, &said, &[proxy]),
            Client {
                key: other,
                tls: false
            }
        );
        // IPv6 clients by their /64.
        let a = client_of("2001:db8::1".parse().unwrap(), &HeaderMap::new(), &[]);
        let b = client_of("2001:db8::2:3".parse().unwrap(), &HeaderMap::new(), &[]);
        assert_eq!(a.key, b.key);
        assert_eq!(trusted_proxies(" 10.0.0.1, ::1 ").unwrap().len(), 2);
        assert_eq!(trusted_proxies("10.0.0.1,proxy.local"), Err(2));
    }

    #[test]
    fn a_form_from_another_site_is_not_the_panels() {
        let host = ("host", "panel.example:8790");
        assert!(same_site(&headers(&[host])));
        assert!(same_site(&headers(&[
            host,
            ("origin", "http://panel.example:8790")
        ])));
        assert!(same_site(&headers(&[
            host,
            ("referer", "https://panel.example:8790/login?x")
        ])));
        assert!(!same_site(&headers(&[
            host,
            ("origin", "https://evil.example")
        ])));
        assert!(!same_site(&headers(&[host, ("origin", "null")])));
        assert!(!same_site(&headers(&[
            host,
            ("referer", "https://evil.example/panel.example:8790")
        ])));
    }
}
