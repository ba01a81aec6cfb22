//! The egress proxy's reading of a client's request head (crates/egress proxy.rs: read_head,
//! check_head, parse_request), from a client in memory that sends its bytes in pieces.
//!
//! - bounded: the proxy never holds more than its limit and one read past it, and a head it takes
//!   ends within its limit;
//! - a head is taken the same whatever the pieces were, and is the request the head alone is;
//! - a plain request is sent on as exactly one complete request, in origin form, with one `Host`
//!   (the target's), no proxy or connection headers but `Connection: close`, and a bounded size.
#![no_main]

use egress::fuzz::{HEAD_CHUNK, HeadRead, Request, parse_request, read_head};
use libfuzzer_sys::fuzz_target;

const DROPPED: [&str; 4] = ["connection", "keep-alive", "upgrade", "host"];

fn plain_request_sent_on(sent: &[u8], head: &[u8]) {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    let status = req.parse(sent).expect("the request sent on parses");
    assert_eq!(
        status,
        httparse::Status::Complete(sent.len()),
        "not one whole request"
    );
    assert!(
        req.path.is_some_and(|p| p.starts_with('/')),
        "not in origin form"
    );
    let hosts = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"));
    assert_eq!(hosts.count(), 1, "not exactly one Host");
    let connection: Vec<&[u8]> = req
        .headers
        .iter()
        .filter(|h| {
            h.name.to_ascii_lowercase().starts_with("proxy-")
                || DROPPED[..3].iter().any(|d| h.name.eq_ignore_ascii_case(d))
        })
        .map(|h| h.value)
        .collect();
    assert_eq!(
        connection,
        [b"close"],
        "proxy or connection headers sent on"
    );
    assert!(sent.len() <= 2 * head.len() + 64, "grew past its bound");
}

fuzz_target!(|data: &[u8]| {
    // The limit, the pieces' sizes, then what the client sends.
    let [limit, a, b, c, sent @ ..] = data else {
        return;
    };
    let max = 64 + usize::from(*limit) * 64;
    let pieces = [usize::from(*a), usize::from(*b), usize::from(*c)];
    let (read, delivered) = read_head(sent, &pieces, max);
    assert!(delivered <= max + HEAD_CHUNK, "held more than its limit");
    let (whole, _) = read_head(sent, &[usize::MAX], max);
    let taken = |r: HeadRead| match r {
        HeadRead::Head { len, request, .. } => Some((len, request)),
        _ => None,
    };
    if let HeadRead::Head {
        len,
        buffered,
        request,
    } = &read
    {
        assert!(*len <= max && *buffered <= max + HEAD_CHUNK);
        assert_eq!(parse_request(&sent[..*len]).as_ref(), request.as_ref());
        if let Some(Request::Plain(_, out)) = request {
            plain_request_sent_on(out, &sent[..*len]);
        }
    }
    assert_eq!(taken(read), taken(whole), "the head depends on the pieces");
});
