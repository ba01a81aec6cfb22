//! JSON-RPC messages as the peers wrote them.
//!
//! The hub reads of a message only what it must (its id, method, and where its params, result or
//! error are) and keeps the bytes. A message is changed by splicing: the id pi gave a request is
//! swapped for the hub's own on the way to the server and back on the way to pi, a progress token
//! likewise, and everything else (field order, whitespace, fields nobody here knows) goes on as it
//! came. Only `tools/list` results and `initialize` answers are read whole.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncReadExt};

/// One JSON-RPC message (a JSON object), and where its members' values are in it.
#[derive(Clone)]
pub(crate) struct Message {
    bytes: Bytes,
    id: Option<Range<usize>>,
    method: Option<Box<str>>,
    params: Option<Range<usize>>,
    result: Option<Range<usize>>,
    error: Option<Range<usize>>,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the content: it may hold anything.
        f.debug_struct("Message")
            .field("method", &self.method)
            .field("bytes", &self.bytes.len())
            .finish_non_exhaustive()
    }
}

/// The members the hub reads; every other one is passed over (and kept in the bytes).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(default, borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

/// A member that is there, `null` included (`Option` alone would read `null` as absent).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Where `inner` (a slice of `outer`) is in `outer`.
fn span(outer: &[u8], inner: &str) -> Option<Range<usize>> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    let end = start.checked_add(inner.len())?;
    (end <= outer.len()).then_some(start..end)
}

/// Whether `bytes` holds a JSON object (its first byte that is not white space is `{`).
fn is_object(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

impl Message {
    /// Reads `bytes` as one JSON-RPC message: `None` when it is not a JSON object (a batch, a
    /// value of another kind, not JSON, or a member given twice).
    pub(crate) fn parse(bytes: Bytes) -> Option<Message> {
        if !is_object(&bytes) {
            return None;
        }
        let envelope: Envelope<'_> = serde_json::from_slice(&bytes).ok()?;
        let at = |raw: Option<&RawValue>| match raw {
            None => Some(None),
            Some(r) => span(&bytes, r.get()).map(Some),
        };
        let (id, params, result, error) = (
            at(envelope.id)?,
            at(envelope.params)?,
            at(envelope.result)?,
            at(envelope.error)?,
        );
        let method = envelope.method.map(|m| Box::from(m.as_ref()));
        Some(Message {
            bytes,
            id,
            method,
            params,
            result,
            error,
        })
    }

    /// The message as it came.
    pub(crate) fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    pub(crate) fn method(&self) -> Option<&str> {
        self.method.as_deref()
    }

    /// The id's JSON text (`7`, `"a-1"`, `null`), when the message has one.
    pub(crate) fn id(&self) -> Option<Bytes> {
        self.id.clone().map(|r| self.bytes.slice(r))
    }

    pub(crate) fn has_id(&self) -> bool {
        self.id.is_some()
    }

    /// The id when it is `null`.
    pub(crate) fn id_is_null(&self) -> bool {
        self.id().is_some_and(|id| &id[..] == b"null")
    }

    /// The id as a number the hub gave (also when a server wrote it as a string of digits).
    pub(crate) fn numeric_id(&self) -> Option<u64> {
        let id = self.id()?;
        let text = std::str::from_utf8(&id).ok()?;
        let digits = text.strip_prefix('"').and_then(|t| t.strip_suffix('"'));
        digits.unwrap_or(text).parse().ok()
    }

    /// The id when it is a string, unescaped.
    pub(crate) fn string_id(&self) -> Option<String> {
        serde_json::from_slice::<String>(&self.id()?).ok()
    }

    pub(crate) fn params(&self) -> Option<&[u8]> {
        self.params.clone().map(|r| &self.bytes[r])
    }

    pub(crate) fn result(&self) -> Option<&[u8]> {
        self.result.clone().map(|r| &self.bytes[r])
    }

    pub(crate) fn error(&self) -> Option<&[u8]> {
        self.error.clone().map(|r| &self.bytes[r])
    }

    /// A request (a method and an id), or an answer (an id and a result or an error, no method);
    /// a notification is neither (a method, no id).
    pub(crate) fn is_request(&self) -> bool {
        self.method.is_some() && self.id.is_some()
    }

    pub(crate) fn is_answer(&self) -> bool {
        self.method.is_none()
            && self.id.is_some()
            && (self.result.is_some() || self.error.is_some())
    }

    /// The same message with its id's value replaced by `id` (JSON text).
    pub(crate) fn with_id(&self, id: &[u8]) -> Bytes {
        let mut edits = Vec::with_capacity(1);
        if let Some(at) = self.id.clone() {
            edits.push(Edit::new(at, id));
        }
        splice(&self.bytes, edits)
    }

    /// The same message with these edits made: each replaces a range of the bytes.
    pub(crate) fn edited(&self, edits: Vec<Edit<'_>>) -> Bytes {
        splice(&self.bytes, edits)
    }

    /// An edit replacing the id's value with `id`.
    pub(crate) fn id_edit<'a>(&self, id: &'a [u8]) -> Option<Edit<'a>> {
        self.id.clone().map(|at| Edit::new(at, id))
    }

    /// Where the params are, for an edit inside them.
    pub(crate) fn params_start(&self) -> Option<usize> {
        self.params.as_ref().map(|r| r.start)
    }

    /// Where the result is, for an edit inside it.
    pub(crate) fn result_start(&self) -> Option<usize> {
        self.result.as_ref().map(|r| r.start)
    }
}

/// One range of a message's bytes and what goes there instead.
pub(crate) struct Edit<'a> {
    at: Range<usize>,
    with: &'a [u8],
}

impl<'a> Edit<'a> {
    pub(crate) fn new(at: Range<usize>, with: &'a [u8]) -> Edit<'a> {
        Edit { at, with }
    }

    /// The same edit, `by` bytes further on (for a range found inside a member).
    pub(crate) fn shifted(self, by: usize) -> Edit<'a> {
        Edit {
            at: self.at.start + by..self.at.end + by,
            with: self.with,
        }
    }
}

/// `bytes` with `edits` made; an edit overlapping an earlier one, or out of range, is not made.
pub(crate) fn splice(bytes: &Bytes, mut edits: Vec<Edit<'_>>) -> Bytes {
    if edits.is_empty() {
        return bytes.clone();
    }
    edits.sort_by_key(|e| e.at.start);
    let grown: usize = edits.iter().map(|e| e.with.len()).sum();
    let mut out = Vec::with_capacity(bytes.len() + grown);
    let mut at = 0;
    for edit in edits {
        // Overlapping edits are not made: the later one is dropped.
        if edit.at.start < at || edit.at.end > bytes.len() {
            continue;
        }
        out.extend_from_slice(&bytes[at..edit.at.start]);
        out.extend_from_slice(edit.with);
        at = edit.at.end;
    }
    out.extend_from_slice(&bytes[at..]);
    Bytes::from(out)
}

/// What the hub reads of a request's params: a tool call's `name`, and `_meta.progressToken`.
pub(crate) struct RequestParams {
    /// The `name` member, when it is a string.
    pub(crate) name: Option<String>,
    /// Where `_meta.progressToken`'s value is, inside the params.
    pub(crate) progress_token: Option<Range<usize>>,
}

#[derive(Deserialize)]
struct ParamsShape<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    name: Option<&'a RawValue>,
    #[serde(default, rename = "_meta", borrow, deserialize_with = "present")]
    meta: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct MetaShape<'a> {
    #[serde(
        default,
        rename = "progressToken",
        borrow,
        deserialize_with = "present"
    )]
    progress_token: Option<&'a RawValue>,
}

/// Why a request's params cannot be relayed: MCP's params and `_meta` are objects. The tool's
/// name is kept, when it could be read, to count the refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ParamsError {
    #[error("the request's params are not an object")]
    NotObject,
    #[error("the request's params._meta is not an object")]
    Meta { name: Option<String> },
}

impl ParamsError {
    /// The tool's name, when the params had one.
    pub(crate) fn name(&self) -> Option<&str> {
        match self {
            ParamsError::Meta { name } => name.as_deref(),
            ParamsError::NotObject => None,
        }
    }
}

impl RequestParams {
    /// Reads `params` (an object, or absent).
    pub(crate) fn read(params: Option<&[u8]>) -> Result<RequestParams, ParamsError> {
        let Some(params) = params else {
            return Ok(RequestParams {
                name: None,
                progress_token: None,
            });
        };
        if !is_object(params) {
            return Err(ParamsError::NotObject);
        }
        let shape: ParamsShape<'_> =
            serde_json::from_slice(params).map_err(|_| ParamsError::NotObject)?;
        let name = shape
            .name
            .and_then(|n| serde_json::from_str::<String>(n.get()).ok());
        let progress_token = match shape.meta {
            None => None,
            Some(meta) if meta.get() == "null" => None,
            Some(meta) if is_object(meta.get().as_bytes()) => {
                let meta_shape: MetaShape<'_> = serde_json::from_str(meta.get())
                    .map_err(|_| ParamsError::Meta { name: name.clone() })?;
                meta_shape
                    .progress_token
                    .and_then(|t| span(params, t.get()))
            }
            Some(_) => return Err(ParamsError::Meta { name }),
        };
        Ok(RequestParams {
            name,
            progress_token,
        })
    }
}

/// Where a `tools/list` result's `tools` array is, and the same array with only the tools `keep`
/// takes by name (each as the server wrote it); `None` when the result has no such array.
pub(crate) fn filter_tools(
    result: &[u8],
    keep: impl Fn(&str) -> bool,
) -> Option<(Range<usize>, Vec<u8>)> {
    #[derive(Deserialize)]
    struct Listed<'a> {
        #[serde(borrow)]
        tools: &'a RawValue,
    }
    #[derive(Deserialize)]
    struct Named<'a> {
        #[serde(borrow)]
        name: Cow<'a, str>,
    }
    let listed: Listed<'_> = serde_json::from_slice(result).ok()?;
    let at = span(result, listed.tools.get())?;
    let tools: Vec<&RawValue> = serde_json::from_str(listed.tools.get()).ok()?;
    let mut out = Vec::with_capacity(at.len());
    out.push(b'[');
    for tool in tools {
        let named = serde_json::from_str::<Named<'_>>(tool.get());
        if named.is_ok_and(|t| keep(&t.name)) {
            if out.len() > 1 {
                out.push(b',');
            }
            out.extend_from_slice(tool.get().as_bytes());
        }
    }
    out.push(b']');
    Some((at, out))
}

/// A string member of an object, and where its value is.
pub(crate) fn string_member(object: &[u8], key: &str) -> Option<(String, Range<usize>)> {
    let members: HashMap<Cow<'_, str>, &RawValue> = serde_json::from_slice(object).ok()?;
    let value = members.get(key)?;
    let text = serde_json::from_str::<String>(value.get()).ok()?;
    Some((text, span(object, value.get())?))
}

/// Where a progress notification's `progressToken` is, inside its params.
pub(crate) fn progress_token(params: &[u8]) -> Option<Range<usize>> {
    #[derive(Deserialize)]
    struct Progress<'a> {
        #[serde(rename = "progressToken", borrow)]
        token: &'a RawValue,
    }
    let progress: Progress<'_> = serde_json::from_slice(params).ok()?;
    span(params, progress.token.get())
}

/// Where a cancellation's `requestId` is, inside its params.
pub(crate) fn cancelled_request(params: &[u8]) -> Option<Bytes> {
    #[derive(Deserialize)]
    struct Cancelled<'a> {
        #[serde(rename = "requestId", borrow)]
        request_id: &'a RawValue,
    }
    let cancelled: Cancelled<'_> = serde_json::from_slice(params).ok()?;
    Some(Bytes::copy_from_slice(
        cancelled.request_id.get().as_bytes(),
    ))
}

/// Whether a tool call's result says it failed (`isError: true`). Most results have no `isError`
/// at all: those are not read a second time.
pub(crate) fn is_error_result(result: &[u8]) -> bool {
    if memchr::memmem::find(result, b"isError").is_none() {
        return false;
    }
    #[derive(Deserialize)]
    struct Outcome {
        #[serde(default, rename = "isError")]
        is_error: Option<serde_json::Value>,
    }
    serde_json::from_slice::<Outcome>(result)
        .is_ok_and(|o| o.is_error == Some(serde_json::Value::Bool(true)))
}

/// A JSON-RPC error's `code`.
pub(crate) fn error_code(error: &[u8]) -> Option<i64> {
    #[derive(Deserialize)]
    struct Code {
        code: i64,
    }
    serde_json::from_slice::<Code>(error).ok().map(|c| c.code)
}

/// One message as an event of a stream (`event: message`, then its lines as `data:` lines: a
/// message a server wrote over several lines stays as it was).
pub(crate) fn event(message: &[u8]) -> Bytes {
    let mut event = Vec::with_capacity(message.len() + 32);
    event.extend_from_slice(b"event: message\n");
    // A stream's reader ends a line at CR, LF or CRLF alike: each ends a `data:` line here, or a
    // CR alone (white space in JSON) would cut the message short for pi.
    let mut rest = message;
    loop {
        let end = memchr::memchr2(b'\r', b'\n', rest);
        event.extend_from_slice(b"data: ");
        event.extend_from_slice(&rest[..end.unwrap_or(rest.len())]);
        event.push(b'\n');
        let Some(at) = end else { break };
        let ending = if rest[at..].starts_with(b"\r\n") {
            2
        } else {
            1
        };
        rest = &rest[at + ending..];
    }
    event.push(b'\n');
    Bytes::from(event)
}

/// One line of a stdio server's output.
#[derive(Debug)]
pub(crate) enum Line {
    Whole(Bytes),
    /// Longer than the limit: not kept; the id it carried at its top level, if one was found.
    TooLong {
        id: Option<Bytes>,
    },
}

/// Reads newline-delimited messages (a stdio server's standard output), each line held whole up
/// to `max_line` bytes; a longer one is read through and dropped, with its id picked out on the way
/// so that the request it answers can be failed.
pub(crate) struct LineReader<R> {
    inner: R,
    buffer: BytesMut,
    /// How much of the buffer is known to hold no newline.
    searched: usize,
    max_line: usize,
    /// Scanning a line that is too long.
    skipping: Option<IdScanner>,
    eof: bool,
}

/// How much is read at a time.
const CHUNK: usize = 64 * 1024;

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub(crate) fn new(inner: R, max_line: usize) -> LineReader<R> {
        LineReader {
            inner,
            buffer: BytesMut::with_capacity(CHUNK),
            searched: 0,
            max_line,
            skipping: None,
            eof: false,
        }
    }

    /// From now on, lines up to `max_line` bytes are held whole.
    pub(crate) fn set_max_line(&mut self, max_line: usize) {
        self.max_line = max_line;
    }

    /// The next line (without its end), or `None` at the end of the output. Cancel-safe: what was
    /// read stays in the buffer.
    pub(crate) async fn next(&mut self) -> Option<Line> {
        loop {
            if let Some(line) = self.take_line() {
                return Some(line);
            }
            if self.eof {
                // What is left without a newline is a last line.
                if let Some(scanner) = self.skipping.take() {
                    self.buffer.clear();
                    return Some(Line::TooLong { id: scanner.id() });
                }
                if self.buffer.is_empty() {
                    return None;
                }
                self.searched = 0;
                let line = self.buffer.split().freeze();
                return Some(Line::Whole(trim_cr(line)));
            }
            if self.buffer.capacity() - self.buffer.len() < CHUNK / 4 {
                self.buffer.reserve(CHUNK);
            }
            match self.inner.read_buf(&mut self.buffer).await {
                Ok(0) | Err(_) => self.eof = true,
                Ok(_) => {}
            }
        }
    }

    fn take_line(&mut self) -> Option<Line> {
        let newline =
            memchr::memchr(b'\n', &self.buffer[self.searched..]).map(|at| at + self.searched);
        if self.skipping.is_none() {
            match newline {
                Some(at) if at <= self.max_line => {
                    self.searched = 0;
                    let line = self.buffer.split_to(at).freeze();
                    let _ = self.buffer.split_to(1);
                    return Some(Line::Whole(trim_cr(line)));
                }
                None if self.buffer.len() <= self.max_line => {
                    self.searched = self.buffer.len();
                    return None;
                }
                // Too long: read through to its end, keeping nothing but its id.
                _ => self.skipping = Some(IdScanner::default()),
            }
        }
        let scanner = self.skipping.as_mut()?;
        let upto = newline.unwrap_or(self.buffer.len());
        scanner.feed(&self.buffer[..upto]);
        let _ = self.buffer.split_to(upto);
        self.searched = 0;
        if newline.is_none() {
            // A large buffer is not kept for the small lines after it.
            if self.buffer.capacity() > 4 * CHUNK {
                self.buffer = BytesMut::with_capacity(CHUNK);
            }
            return None;
        }
        let _ = self.buffer.split_to(1);
        let id = self.skipping.take().and_then(IdScanner::id);
        Some(Line::TooLong { id })
    }
}

fn trim_cr(line: Bytes) -> Bytes {
    if line.last() == Some(&b'\r') {
        line.slice(..line.len() - 1)
    } else {
        line
    }
}

/// Picks the top-level `id` out of a JSON object read piece by piece, holding a few bytes only.
#[derive(Default)]
struct IdScanner {
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// At the top level, the string being read is a key (not a value).
    key: Option<Vec<u8>>,
    /// The last key read at the top level, while its value has not started.
    last_key: Option<Vec<u8>>,
    /// Reading the top-level `id` value.
    capturing: Option<Vec<u8>>,
    found: Option<Vec<u8>>,
    expect_key: bool,
}

/// A key or an id longer than this is not an id the hub gave.
const SCAN_LIMIT: usize = 64;

impl IdScanner {
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.step(b);
        }
    }

    fn step(&mut self, b: u8) {
        if let Some(value) = self.capturing.as_mut() {
            let ends = !self.in_string && self.depth == 1 && (b == b',' || b == b'}');
            if ends {
                let value = std::mem::take(value);
                self.capturing = None;
                if self.found.is_none() {
                    self.found = Some(value);
                }
            } else if value.len() < SCAN_LIMIT {
                value.push(b);
            }
        }
        if self.in_string {
            if let Some(key) = self.key.as_mut()
                && key.len() <= SCAN_LIMIT
                && (b != b'"' || self.escaped)
            {
                key.push(b);
            }
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if let Some(key) = self.key.take() {
                    self.last_key = Some(key);
                }
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.key = Some(Vec::new());
                    self.expect_key = false;
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.expect_key = true;
                }
            }
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            b',' if self.depth == 1 => self.expect_key = true,
            b':' if self.depth == 1 => {
                let key = self.last_key.take();
                if key.as_deref() == Some(b"id") && self.found.is_none() {
                    self.capturing = Some(Vec::new());
                }
            }
            _ => {}
        }
    }

    /// The id found, when it is a JSON string or number: what was captured of a longer value (cut
    /// at [`SCAN_LIMIT`]) or of a line that is no JSON is no id, and never goes into an answer.
    fn id(self) -> Option<Bytes> {
        let found = self.found?;
        let text = std::str::from_utf8(&found).ok()?.trim();
        let id = serde_json::from_str::<serde_json::Value>(text).ok()?;
        (id.is_string() || id.is_number()).then(|| Bytes::copy_from_slice(text.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn message(text: &str) -> Message {
        Message::parse(Bytes::copy_from_slice(text.as_bytes())).unwrap()
    }

    #[test]
    fn a_message_is_read_for_its_envelope_only() {
        let m = message(
            r#"{"result":{"tools":[],"future":{"x":1}},"jsonrpc":"2.0","id":7,"extra":true}"#,
        );
        assert!(m.is_answer());
        assert_eq!(m.numeric_id(), Some(7));
        assert_eq!(m.result().unwrap(), br#"{"tools":[],"future":{"x":1}}"#);
        let request = message(r#"{"jsonrpc":"2.0","id":"a-1","method":"tools/call","params":{}}"#);
        assert!(request.is_request());
        assert_eq!(request.method(), Some("tools/call"));
        assert_eq!(request.string_id().as_deref(), Some("a-1"));
        let notification = message(r#"{"jsonrpc":"2.0","method":"notifications/x"}"#);
        assert!(!notification.is_request() && !notification.is_answer());
        assert!(message(r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#).id_is_null());
        assert_eq!(message(r#"{"id":"12","result":{}}"#).numeric_id(), Some(12));
    }

    #[test]
    fn what_is_not_one_message_is_refused() {
        for text in [
            "[]",
            r#"[{"jsonrpc":"2.0","id":1,"method":"m"}]"#,
            "not json",
            "7",
            r#"{"id":1,"id":2,"method":"m"}"#,
            r#"{"id":1,"method":"m""#,
        ] {
            assert!(
                Message::parse(Bytes::copy_from_slice(text.as_bytes())).is_none(),
                "{text}"
            );
        }
    }

    #[test]
    fn a_new_id_is_spliced_in_and_nothing_else_moves() {
        let text = r#"{ "result" : {"b":2, "a":1}, "id" : 5 , "jsonrpc":"2.0", "z":[1] }"#;
        let m = message(text);
        let out = m.with_id(br#""pi-9""#);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{ "result" : {"b":2, "a":1}, "id" : "pi-9" , "jsonrpc":"2.0", "z":[1] }"#
        );
        let request =
            message(r#"{"id":3,"method":"m","params":{"_meta":{"progressToken":"t-1","k":1}}}"#);
        let params = RequestParams::read(request.params()).unwrap();
        let token = params.progress_token.unwrap();
        let edits = vec![
            request.id_edit(b"41").unwrap(),
            Edit::new(token, b"41").shifted(request.params_start().unwrap()),
        ];
        assert_eq!(
            std::str::from_utf8(&request.edited(edits)).unwrap(),
            r#"{"id":41,"method":"m","params":{"_meta":{"progressToken":41,"k":1}}}"#
        );
    }

    #[test]
    fn params_are_read_for_a_name_and_a_progress_token() {
        let p = RequestParams::read(Some(br#"{"name":"echo","arguments":{"name":7}}"#)).unwrap();
        assert_eq!(p.name.as_deref(), Some("echo"));
        assert!(p.progress_token.is_none());
        assert_eq!(
            RequestParams::read(Some(br#"[1]"#)).err(),
            Some(ParamsError::NotObject)
        );
        assert_eq!(
            RequestParams::read(Some(br#"{"name":"echo","_meta":"text"}"#)).err(),
            Some(ParamsError::Meta {
                name: Some("echo".to_owned())
            })
        );
        let listed = br#"{"tools":[{"name":"a","x":1}, {"name":"b"},{"name":"c","future":{}}],"nextCursor":"n"}"#;
        let (at, kept) = filter_tools(listed, |n| n != "b").unwrap();
        assert_eq!(
            &listed[at],
            br#"[{"name":"a","x":1}, {"name":"b"},{"name":"c","future":{}}]"#
        );
        assert_eq!(kept, br#"[{"name":"a","x":1},{"name":"c","future":{}}]"#);
        let (version, at) = string_member(
            br#"{"capabilities":{},"protocolVersion":"2025-06-18"}"#,
            "protocolVersion",
        )
        .unwrap();
        assert_eq!((version.as_str(), at), ("2025-06-18", 37..49));
        assert!(RequestParams::read(None).unwrap().name.is_none());
        assert!(is_error_result(br#"{"content":[],"isError":true}"#));
        assert!(!is_error_result(br#"{"content":[{"isError":true}]}"#));
        assert_eq!(
            error_code(br#"{"code":-32601,"message":"m"}"#),
            Some(-32601)
        );
    }

    #[test]
    fn an_event_keeps_a_message_written_over_several_lines() {
        assert_eq!(
            &event(b"{\"a\":\r\n1}")[..],
            b"event: message\ndata: {\"a\":\ndata: 1}\n\n"
        );
    }

    /// Found by the `rpc_frames` fuzz target: a message with a CR alone between its tokens was
    /// one `data:` line holding the CR, which a stream's reader takes for a line end, so pi read
    /// the message cut short.
    #[test]
    fn a_cr_alone_ends_a_data_line_too() {
        assert_eq!(
            &event(b"{\"a\":\r1,\r\"b\":2}")[..],
            b"event: message\ndata: {\"a\":\ndata: 1,\ndata: \"b\":2}\n\n"
        );
    }

    #[tokio::test]
    async fn lines_are_read_whole_and_a_long_one_is_dropped_with_its_id() {
        let long = format!(
            r#"{{"result":{{"text":"{}","id":99}},"jsonrpc":"2.0","id":12}}"#,
            "x".repeat(300)
        );
        let text = format!(
            "{}\r\n{long}\n{}\n{}",
            r#"{"id":1,"result":{}}"#, r#"{"id":2,"result":{}}"#, r#"{"id":3,"result":{}}"#
        );
        let (mut writer, reader) = tokio::io::duplex(7);
        let write = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            writer.write_all(text.as_bytes()).await.unwrap();
        });
        let mut lines = LineReader::new(reader, 100);
        let mut seen = Vec::new();
        while let Some(line) = lines.next().await {
            seen.push(line);
        }
        write.await.unwrap();
        assert_eq!(seen.len(), 4, "{seen:?}");
        assert!(matches!(&seen[0], Line::Whole(l) if &l[..] == br#"{"id":1,"result":{}}"#));
        assert!(matches!(&seen[1], Line::TooLong { id: Some(id) } if &id[..] == b"12"));
        assert!(matches!(&seen[2], Line::Whole(l) if &l[..] == br#"{"id":2,"result":{}}"#));
        assert!(matches!(&seen[3], Line::Whole(l) if &l[..] == br#"{"id":3,"result":{}}"#));
    }

    /// Found by the `rpc_frames` fuzz target: a line too long whose id is cut at the scanner's
    /// limit, or is no JSON value, was answered under that id, and the answer was no JSON.
    #[test]
    fn an_id_cut_short_or_not_json_is_no_id() {
        for text in [
            format!(r#"{{"id":"{}","method":"tools/call"}}"#, "y".repeat(200)),
            r#"{"id":zzz,"method":"m"}"#.to_owned(),
            r#"{"id":{"a":1},"method":"m"}"#.to_owned(),
        ] {
            let mut scanner = IdScanner::default();
            scanner.feed(text.as_bytes());
            assert_eq!(scanner.id(), None, "{text}");
        }
        let mut scanner = IdScanner::default();
        scanner.feed(br#"{"id": -7 ,"method":"m"}"#);
        assert_eq!(scanner.id().as_deref(), Some(&b"-7"[..]));
    }

    #[test]
    fn the_scanner_finds_the_top_level_id_wherever_it_is() {
        for (text, id) in [
            (r#"{"id":4,"result":{"id":5}}"#, Some("4")),
            (
                r#"{"result":{"id":5,"s":"\"id\":6"},"id" : "k\"1" }"#,
                Some(r#""k\"1""#),
            ),
            (r#"{"result":[{"id":5}]}"#, None),
        ] {
            let mut scanner = IdScanner::default();
            scanner.feed(text.as_bytes());
            assert_eq!(
                scanner.id().map(|b| String::from_utf8(b.to_vec()).unwrap()),
                id.map(str::to_owned),
                "{text}"
            );
        }
    }
}
