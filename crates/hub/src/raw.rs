//! A server's results as the server wrote them.
//!
//! rmcp reads every message into its typed model, which keeps only the fields it knows: a tool's
//! `execution`, say, is gone by the time the relay sees the tool list. So the bytes are also read
//! where they arrive (a stdio server's standard output, an HTTP server's JSON body or event
//! stream), and each response's `result` is kept here by its request id until the relay takes it
//! and hands it to pi in place of the typed one. A response that nobody takes (the handshake's
//! own, one to a request rmcp made by itself) is dropped once newer ones push it out.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use rmcp::model::RequestId;
use serde_json::Value;
use tokio::io::{AsyncRead, ReadBuf};

/// How many results wait to be taken at most; an older one is dropped for a newer one.
const KEPT: usize = 64;

/// The line buffer kept between lines at most, bytes.
const SMALL_LINE: usize = 64 * 1024;

/// Results by request id, as the server sent them. Cheap to clone; clones share the results.
#[derive(Clone, Default)]
pub struct RawResults(Arc<Mutex<Kept>>);

#[derive(Default)]
struct Kept {
    by_id: HashMap<String, Value>,
    order: VecDeque<String>,
    /// Requests whose results nobody will take (cancelled ones), newest last.
    forgotten: VecDeque<String>,
}

impl std::fmt::Debug for RawResults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawResults").finish_non_exhaustive()
    }
}

impl RawResults {
    /// Looks at one whole message as it arrived: a response with a result is kept by its id;
    /// anything else (a request, a notification, an error, what is not JSON) is passed over.
    pub fn see(&self, message: &[u8]) {
        // Most messages are small; a result is the one kind worth parsing twice.
        if !contains(message, b"\"result\"") {
            return;
        }
        let Ok(Value::Object(mut message)) = serde_json::from_slice::<Value>(message) else {
            return;
        };
        if message.contains_key("method") {
            return;
        }
        let (Some(id), Some(result)) = (message.remove("id"), message.remove("result")) else {
            return;
        };
        if !matches!(id, Value::Number(_) | Value::String(_)) {
            return;
        }
        let key = id.to_string();
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = kept.forgotten.iter().position(|k| *k == key) {
            kept.forgotten.remove(at);
            return;
        }
        if kept.by_id.insert(key.clone(), result).is_none() {
            kept.order.push_back(key);
        }
        while kept.order.len() > KEPT {
            if let Some(old) = kept.order.pop_front() {
                kept.by_id.remove(&old);
            }
        }
    }

    /// The result of request `id` as the server sent it, if it was seen; it is kept no longer.
    pub fn take(&self, id: &RequestId) -> Option<Value> {
        let key = serde_json::to_string(id).ok()?;
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let result = kept.by_id.remove(&key)?;
        kept.order.retain(|k| *k != key);
        Some(result)
    }

    /// Drops the result of request `id` if it was seen, and the one that may still come.
    pub fn forget(&self, id: &RequestId) {
        let Ok(key) = serde_json::to_string(id) else {
            return;
        };
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.by_id.remove(&key).is_some() {
            kept.order.retain(|k| *k != key);
            return;
        }
        if kept.forgotten.len() >= KEPT {
            kept.forgotten.pop_front();
        }
        kept.forgotten.push_back(key);
    }

    /// Takes the first result kept that `pick` chooses, whatever its id.
    pub fn take_where(&self, pick: impl Fn(&Value) -> bool) -> Option<Value> {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let key = kept
            .order
            .iter()
            .find(|k| kept.by_id.get(*k).is_some_and(&pick))?
            .clone();
        kept.order.retain(|k| *k != key);
        kept.by_id.remove(&key)
    }

    /// Drops every result kept.
    pub fn clear(&self) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.by_id.clear();
        kept.order.clear();
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A reader of newline-delimited JSON (a stdio server's standard output) that passes every byte on
/// unchanged and shows each whole line to [`RawResults::see`]. A line longer than `max_line` is not
/// kept (rmcp still reads it; the relay then uses rmcp's typed result).
pub struct LineTap<R> {
    inner: R,
    raw: RawResults,
    line: Vec<u8>,
    max_line: usize,
    too_long: bool,
}

impl<R> LineTap<R> {
    pub fn new(inner: R, raw: RawResults, max_line: usize) -> LineTap<R> {
        LineTap {
            inner,
            raw,
            line: Vec::new(),
            max_line,
            too_long: false,
        }
    }

    fn look(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let end = bytes.iter().position(|b| *b == b'\n');
            let part = &bytes[..end.unwrap_or(bytes.len())];
            if !self.too_long {
                if self.line.len() + part.len() > self.max_line {
                    self.too_long = true;
                    self.line = Vec::new();
                } else {
                    self.line.extend_from_slice(part);
                }
            }
            let Some(end) = end else { return };
            if !self.too_long {
                self.raw.see(&self.line);
            }
            // A large line's buffer is not kept for the small ones after it.
            if self.line.capacity() > SMALL_LINE {
                self.line = Vec::new();
            } else {
                self.line.clear();
            }
            self.too_long = false;
            bytes = &bytes[end + 1..];
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineTap<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled {
            let fresh = buf.filled()[before..].to_vec();
            this.look(&fresh);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn id(n: i64) -> RequestId {
        RequestId::Number(n)
    }

    #[test]
    fn a_result_is_kept_whole_by_its_id_and_taken_once() {
        let raw = RawResults::default();
        raw.see(br#"{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"a","execution":{"taskSupport":"optional"}}]}}"#);
        raw.see(br#"{"jsonrpc":"2.0","id":"s-1","result":{"x":1}}"#);
        let kept = raw.take(&id(7)).unwrap();
        assert_eq!(kept["tools"][0]["execution"]["taskSupport"], "optional");
        assert!(raw.take(&id(7)).is_none());
        let by_string = raw.take(&RequestId::String("s-1".into())).unwrap();
        assert_eq!(by_string["x"], 1);
    }

    #[test]
    fn requests_notifications_errors_and_garbage_are_passed_over() {
        let raw = RawResults::default();
        raw.see(
            br#"{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{"result":1}}"#,
        );
        raw.see(
            br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"result"}}"#,
        );
        raw.see(br#"{"jsonrpc":"2.0","id":2,"error":{"code":-1,"message":"\"result\""}}"#);
        raw.see(b"\"result\" not json");
        for n in 1..=2 {
            assert!(raw.take(&id(n)).is_none());
        }
    }

    #[test]
    fn only_the_newest_results_wait() {
        let raw = RawResults::default();
        for n in 0..(KEPT as i64 + 10) {
            raw.see(format!(r#"{{"jsonrpc":"2.0","id":{n},"result":{{}}}}"#).as_bytes());
        }
        assert!(raw.take(&id(0)).is_none());
        assert!(raw.take(&id(9)).is_none());
        assert!(raw.take(&id(10)).is_some());
        assert!(raw.take(&id(KEPT as i64 + 9)).is_some());
        raw.clear();
        assert!(raw.take(&id(11)).is_none());
    }

    #[test]
    fn a_forgotten_request_s_result_is_not_kept_when_it_comes() {
        let raw = RawResults::default();
        raw.forget(&id(5));
        raw.see(br#"{"jsonrpc":"2.0","id":5,"result":{"late":true}}"#);
        assert!(raw.take(&id(5)).is_none());
        // Only once: a later request with the same id is kept again.
        raw.see(br#"{"jsonrpc":"2.0","id":5,"result":{"again":true}}"#);
        assert_eq!(raw.take(&id(5)).unwrap()["again"], true);
        // Already seen: dropped now.
        raw.see(br#"{"jsonrpc":"2.0","id":6,"result":{}}"#);
        raw.forget(&id(6));
        assert!(raw.take(&id(6)).is_none());
    }

    #[tokio::test]
    async fn the_tap_passes_bytes_unchanged_and_sees_lines_split_across_reads() {
        let text = concat!(
            r#"{"jsonrpc":"2.0","id":1,"result":{"a":1}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"result":{"long":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":3,"result":{"b":2}}"#,
            "\n"
        );
        // Delivered a few bytes at a time.
        let (mut writer, reader) = tokio::io::duplex(7);
        let raw = RawResults::default();
        let mut tap = LineTap::new(reader, raw.clone(), 80);
        let write = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            writer.write_all(text.as_bytes()).await.unwrap();
        });
        let mut out = Vec::new();
        tap.read_to_end(&mut out).await.unwrap();
        write.await.unwrap();
        assert_eq!(out, text.as_bytes());
        assert_eq!(raw.take(&id(1)).unwrap()["a"], 1);
        // Longer than the limit: not kept.
        assert!(raw.take(&id(2)).is_none());
        assert_eq!(raw.take(&id(3)).unwrap()["b"], 2);
    }
}
