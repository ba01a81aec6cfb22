//! Thin doors to the hub's private readers for the fuzz targets: the line reader and the JSON-RPC
//! envelope on both sides (what a server writes, what pi's relay sends), the request the server
//! gets for pi's, and the model gateway's reading of a request.

use std::future::Future as _;
use std::io;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use tokio::io::{AsyncRead, ReadBuf};

use crate::raw::{self, LineReader, Message, RequestParams};

/// One line as the reader gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Whole(Vec<u8>),
    /// Longer than the limit, with the id found at its top level.
    TooLong(Option<Vec<u8>>),
}

/// A peer that writes `data` in pieces of the sizes `pieces` gives (cycled; 0 counts as 1).
struct Peer<'a> {
    data: &'a [u8],
    pieces: &'a [usize],
    turn: usize,
}

impl AsyncRead for Peer<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let piece = self
            .pieces
            .get(self.turn % self.pieces.len().max(1))
            .copied()
            .unwrap_or(usize::MAX)
            .max(1);
        let n = piece.min(buf.remaining()).min(self.data.len());
        buf.put_slice(&self.data[..n]);
        self.data = &self.data[n..];
        self.turn += 1;
        Poll::Ready(Ok(()))
    }
}

/// Every line of `data`, written in `pieces`, read with lines of at most `max_line` held whole.
pub fn lines(data: &[u8], pieces: &[usize], max_line: usize) -> Vec<Line> {
    let mut reader = LineReader::new(
        Peer {
            data,
            pieces,
            turn: 0,
        },
        max_line,
    );
    let mut out = Vec::new();
    loop {
        let next = {
            let mut future = pin!(reader.next());
            match future
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
            {
                Poll::Ready(next) => next,
                // A peer in memory is always ready: waiting on it is a bug of the reader.
                Poll::Pending => None,
            }
        };
        match next {
            None => return out,
            Some(raw::Line::Whole(bytes)) => out.push(Line::Whole(bytes.to_vec())),
            Some(raw::Line::TooLong { id }) => out.push(Line::TooLong(id.map(|i| i.to_vec()))),
        }
    }
}

/// What the hub reads of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub bytes: Vec<u8>,
    pub id: Option<Vec<u8>>,
    pub numeric_id: Option<u64>,
    pub string_id: Option<String>,
    pub method: Option<String>,
    pub params: Option<Vec<u8>>,
    pub result: Option<Vec<u8>>,
    pub error: Option<Vec<u8>>,
    pub is_request: bool,
    pub is_answer: bool,
}

impl Envelope {
    fn of(m: &Message) -> Envelope {
        Envelope {
            bytes: m.bytes().to_vec(),
            id: m.id().map(|i| i.to_vec()),
            numeric_id: m.numeric_id(),
            string_id: m.string_id(),
            method: m.method().map(str::to_owned),
            params: m.params().map(<[u8]>::to_vec),
            result: m.result().map(<[u8]>::to_vec),
            error: m.error().map(<[u8]>::to_vec),
            is_request: m.is_request(),
            is_answer: m.is_answer(),
        }
    }
}

/// One message as the hub reads it (a server's line, or a line from pi).
pub fn message(bytes: &[u8]) -> Option<Envelope> {
    Message::parse(Bytes::copy_from_slice(bytes)).map(|m| Envelope::of(&m))
}

/// The message with its id replaced by `id` (JSON text), as the hub answers under another id.
pub fn with_id(bytes: &[u8], id: &[u8]) -> Option<Vec<u8>> {
    Message::parse(Bytes::copy_from_slice(bytes)).map(|m| m.with_id(id).to_vec())
}

/// One line from pi's relay: its message, or what the hub answers at once (`None`: nothing).
pub fn pi_line(line: Line) -> Result<Envelope, Option<Vec<u8>>> {
    let line = match line {
        Line::Whole(bytes) => raw::Line::Whole(Bytes::from(bytes)),
        Line::TooLong(id) => raw::Line::TooLong {
            id: id.map(Bytes::from),
        },
    };
    crate::endpoint::line_message(line)
        .map(|m| Envelope::of(&m))
        .map_err(|answer| answer.map(|a| a.to_vec()))
}

/// What the hub reads of a request's params: the tool's name and where the progress token is.
pub fn request_params(
    params: Option<&[u8]>,
) -> Result<(Option<String>, Option<(usize, usize)>), String> {
    RequestParams::read(params)
        .map(|p| (p.name, p.progress_token.map(|r| (r.start, r.end))))
        .map_err(|e| e.to_string())
}

/// pi's request as the server gets it under the hub's id `id_text`, with pi's progress token.
pub fn upstream_request(bytes: &[u8], id_text: &str) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let message = Message::parse(Bytes::copy_from_slice(bytes))?;
    let params = RequestParams::read(message.params()).ok()?;
    let (request, token) = crate::endpoint::upstream_request(&message, &params, id_text);
    Some((request.to_vec(), token.map(|t| t.to_vec())))
}

/// A server's notification read as the hub routes it: where a progress token is in its params,
/// and the request a cancellation names.
pub fn server_notification(params: &[u8]) -> (Option<(usize, usize)>, Option<Vec<u8>>) {
    (
        raw::progress_token(params).map(|r| (r.start, r.end)),
        raw::cancelled_request(params).map(|b| b.to_vec()),
    )
}

/// A server's result read as the hub reads it: whether it is a failed tool call, the error's code,
/// the tools it lists kept by `keep` (where the list is, and the list kept), and a string member.
#[allow(clippy::type_complexity)]
pub fn server_result(
    result: &[u8],
    keep: impl Fn(&str) -> bool,
) -> (
    bool,
    Option<i64>,
    Option<((usize, usize), Vec<u8>)>,
    Option<(String, (usize, usize))>,
) {
    (
        raw::is_error_result(result),
        raw::error_code(result),
        raw::filter_tools(result, keep).map(|(r, kept)| ((r.start, r.end), kept)),
        raw::string_member(result, "protocolVersion").map(|(s, r)| (s, (r.start, r.end))),
    )
}

/// One message as an event of a stream, as the hub streams it to pi.
pub fn event(message: &[u8]) -> Vec<u8> {
    raw::event(message).to_vec()
}

/// One message as one line, as the hub writes it to pi's relay.
pub fn one_line(message: &[u8]) -> Vec<u8> {
    crate::endpoint::one_line(message).into_owned()
}

/// A JSON-RPC error answer to `id`, as the hub writes it.
pub fn error_answer(id: &[u8], code: i64, words: &str) -> Vec<u8> {
    crate::rpc::error_bytes(id, code, words).to_vec()
}

/// The model gateway's route of a path: pi's (`true`) or a child's, the provider's index, the rest.
pub fn gateway_route(path: &str) -> Option<(bool, usize, &str)> {
    crate::gateway::route(path)
        .map(|(caller, index, rest)| (caller == crate::gateway::Caller::Pi, index, rest))
}

/// The worst case of a request's body under a cap, as the gateway reads it for `api`.
pub fn gateway_worst_case(
    body: &[u8],
    api: config::wire_format::Api,
) -> Result<config::worst_case::Worst, config::worst_case::Unbounded> {
    let json: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    crate::gateway::worst_case(body, &json, api)
}

/// Whether a request with this `Host` and `Origin` is one the gateway takes as from loopback.
pub fn gateway_loopback(host: Option<&[u8]>, origin: Option<&[u8]>) -> bool {
    let mut headers = ::http::HeaderMap::new();
    for (name, value) in [
        (::http::header::HOST, host),
        (::http::header::ORIGIN, origin),
    ] {
        if let Some(v) = value.and_then(|v| ::http::HeaderValue::from_bytes(v).ok()) {
            headers.insert(name, v);
        }
    }
    crate::gateway::loopback_host(&headers)
}
