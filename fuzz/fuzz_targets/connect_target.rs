//! The egress proxy's reading of a request's target (crates/egress rules.rs): a CONNECT
//! authority (`host:port`) and a plain request's absolute URI.
//!
//! - a target read, written back as `host:port`, reads as the same target; its port is never 0;
//! - the same authority reads as the same host and port in a plain `http://` URI;
//! - the rule never lets a target through to the proxy's own machine by the allowlist, and only
//!   `https` on port 443 is allowlisted.
#![no_main]

use config::egress::{Route, parse_allowlist};
use config::endpoints::ModelEndpoints;
use config::url::is_loopback;
use egress::rules::{Rules, connect_target, judge, plain_target};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(authority) = std::str::from_utf8(data) else {
        return;
    };
    let _ = plain_target(authority);
    let Some(target) = connect_target(authority) else {
        return;
    };
    assert_ne!(target.port, 0);
    let written = format!("{}:{}", target.host, target.port);
    assert_eq!(connect_target(&written), Some(target.clone()), "{written}");
    let plain =
        plain_target(&format!("http://{authority}/x")).expect("the same authority in a URI");
    assert_eq!((plain.host, plain.port), (target.host.clone(), target.port));
    let rules = Rules {
        allowlist: parse_allowlist("github.com\n.example.com\nlocalhost\n127.0.0.1\n")
            .unwrap_or_default(),
        endpoints: ModelEndpoints::default(),
    };
    if let Ok(Route::Allowlisted) = judge(&target, &rules) {
        assert!(
            !is_loopback(&target.host),
            "the proxy's own machine is allowlisted"
        );
        assert_eq!(target.port, 443);
    }
});
