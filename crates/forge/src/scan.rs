//! What a `fix` job leaves is searched, every file and every byte, for the values the worker gave
//! the job (its forge token, its secrets, what it forwarded): as they are, and in the encodings a
//! value is carried in (base64, standard and URL-safe, at each of its three alignments; URL
//! percent-encoding; hex), so that a job that writes its token into a file, plainly or encoded,
//! pushes nothing. A hit names the value's variable and the form, never the value. Pure, and
//! streamed: a file is searched as it is read, chunk by chunk.

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;

/// Values shorter than this are not searched for: they would be found everywhere.
pub const MIN_VALUE: usize = 6;

/// Where a value was found, by the value's variable and the form it was in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub variable: String,
    pub form: &'static str,
}

/// Every form of every value, ready to search: the value and its base64 as they are, its
/// percent-encoding and hex in any case of letters.
#[derive(Clone)]
pub struct Needles {
    exact: Set,
    any_case: Set,
    variables: Vec<String>,
    longest: usize,
}

/// Patterns searched together, and the variable and form of each, by its index.
#[derive(Clone, Default)]
struct Set {
    search: Option<AhoCorasick>,
    patterns: Vec<Vec<u8>>,
    labels: Vec<(usize, &'static str)>,
}

impl Set {
    fn add(&mut self, v: usize, form: &'static str, pattern: Vec<u8>) {
        if !self.patterns.contains(&pattern) {
            self.patterns.push(pattern);
            self.labels.push((v, form));
        }
    }

    fn build(&mut self, any_case: bool) {
        self.search = (!self.patterns.is_empty())
            .then(|| {
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostFirst)
                    .ascii_case_insensitive(any_case)
                    .build(&self.patterns)
                    .ok()
            })
            .flatten();
    }

    fn find(&self, bytes: &[u8]) -> Option<(usize, &'static str)> {
        let hit = self.search.as_ref()?.find(bytes)?;
        Some(self.labels[hit.pattern().as_usize()])
    }
}

impl std::fmt::Debug for Needles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Needles({} forms)",
            self.exact.labels.len() + self.any_case.labels.len()
        )
    }
}

/// The base64 text that stands for `value` wherever it sits in the encoded data: for each of the
/// three alignments, the characters that depend on `value`'s bytes alone.
fn base64_forms(value: &[u8], engine: &base64::engine::GeneralPurpose) -> Vec<String> {
    (0..3)
        .filter_map(|offset: usize| {
            let mut padded = vec![0u8; offset];
            padded.extend_from_slice(value);
            let text = engine.encode(&padded);
            let text = text.trim_end_matches('=');
            let start = (offset * 4).div_ceil(3);
            let end = ((offset + value.len()) * 4) / 3;
            text.get(start..end.min(text.len()))
                .filter(|t| t.len() >= MIN_VALUE)
                .map(str::to_owned)
        })
        .collect()
}

/// `value` percent-encoded: every byte outside the unreserved set, or every byte (searched in any
/// case of letters).
fn url_forms(value: &[u8]) -> Vec<String> {
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
    [false, true]
        .into_iter()
        .map(|all| {
            value
                .iter()
                .map(|&b| match !all && unreserved(b) {
                    true => char::from(b).to_string(),
                    false => format!("%{b:02X}"),
                })
                .collect()
        })
        .collect()
}

impl Needles {
    /// Every form of each `(variable, value)`; values shorter than [`MIN_VALUE`] are left out.
    pub fn new<'a>(values: impl IntoIterator<Item = (&'a str, &'a str)>) -> Needles {
        let mut exact = Set::default();
        let mut any_case = Set::default();
        let mut variables = Vec::new();
        for (variable, value) in values {
            if value.len() < MIN_VALUE {
                continue;
            }
            let v = variables.len();
            variables.push(variable.to_owned());
            let bytes = value.as_bytes();
            exact.add(v, "as it is", bytes.to_vec());
            for engine in [
                &base64::engine::general_purpose::STANDARD,
                &base64::engine::general_purpose::URL_SAFE,
            ] {
                for text in base64_forms(bytes, engine) {
                    exact.add(v, "base64", text.into_bytes());
                }
            }
            for text in url_forms(bytes) {
                any_case.add(v, "URL-encoded", text.into_bytes());
            }
            any_case.add(v, "hex", protocol::ids::hex(bytes).into_bytes());
        }
        let longest = exact
            .patterns
            .iter()
            .chain(&any_case.patterns)
            .map(Vec::len)
            .max()
            .unwrap_or(0);
        exact.build(false);
        any_case.build(true);
        Needles {
            exact,
            any_case,
            variables,
            longest,
        }
    }

    /// Whether there is anything to search for.
    pub fn is_empty(&self) -> bool {
        self.exact.search.is_none() && self.any_case.search.is_none()
    }

    /// A value found in `bytes`.
    pub fn find(&self, bytes: &[u8]) -> Option<Found> {
        let (v, form) = self
            .exact
            .find(bytes)
            .or_else(|| self.any_case.find(bytes))?;
        Some(Found {
            variable: self.variables[v].clone(),
            form,
        })
    }

    /// A search through one stream of bytes, fed in pieces.
    pub fn stream(&self) -> Stream<'_> {
        Stream {
            needles: self,
            tail: Vec::new(),
            found: None,
        }
    }
}

/// A search through bytes that come in pieces: a value cut between two pieces is found too.
pub struct Stream<'a> {
    needles: &'a Needles,
    /// The end of what came before, as long as a form less one byte.
    tail: Vec<u8>,
    found: Option<Found>,
}

impl Stream<'_> {
    pub fn feed(&mut self, piece: &[u8]) {
        if self.found.is_some() || self.needles.is_empty() {
            return;
        }
        let keep = self.needles.longest.saturating_sub(1);
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(piece);
        self.found = self.needles.find(&window);
        let from = window.len().saturating_sub(keep);
        self.tail = window.split_off(from);
    }

    /// The first value found so far.
    pub fn found(&self) -> Option<&Found> {
        self.found.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "ghs_CNRY0token/with+odd=chars";

    fn needles() -> Needles {
        Needles::new([("GH_TOKEN", TOKEN), ("SHORT", "abc")])
    }

    fn found_in(text: &str) -> Option<&'static str> {
        needles().find(text.as_bytes()).map(|f| f.form)
    }

    #[test]
    fn a_value_is_found_in_every_common_encoding() {
        let std = base64::engine::general_purpose::STANDARD;
        let url = base64::engine::general_purpose::URL_SAFE;
        assert_eq!(found_in(&format!("token={TOKEN}\n")), Some("as it is"));
        // Base64 of the value inside larger data, at every alignment, in both alphabets.
        for prefix in ["", "x", "xy", "xyz"] {
            for engine in [&std, &url] {
                let data = engine.encode(format!("{prefix}{TOKEN} and more"));
                assert_eq!(found_in(&data), Some("base64"), "{prefix:?} {data}");
            }
        }
        let encoded: String = TOKEN
            .bytes()
            .map(|b| match b {
                b'/' => "%2F".to_owned(),
                b'+' => "%2b".to_owned(),
                b'=' => "%3D".to_owned(),
                _ => char::from(b).to_string(),
            })
            .collect();
        // Percent-encoding in any case of letters.
        assert_eq!(found_in(&encoded), Some("URL-encoded"));
        let upper = TOKEN
            .replace('/', "%2F")
            .replace('+', "%2B")
            .replace('=', "%3D");
        assert_eq!(found_in(&format!("?t={upper}")), Some("URL-encoded"));
        let all: String = TOKEN.bytes().map(|b| format!("%{b:02x}")).collect();
        assert_eq!(found_in(&all), Some("URL-encoded"));
        let hex = protocol::ids::hex(TOKEN);
        assert_eq!(found_in(&hex), Some("hex"));
        assert_eq!(found_in(&hex.to_uppercase()), Some("hex"));
        // Nothing else, and a value too short is not searched for.
        assert_eq!(
            found_in("a file that mentions abc and ghs_CNRY0token"),
            None
        );
        let found = needles().find(TOKEN.as_bytes()).unwrap();
        assert_eq!(found.variable, "GH_TOKEN");
        assert!(!format!("{found:?}{:?}", needles()).contains("CNRY"));
    }

    #[test]
    fn a_value_cut_between_pieces_is_found() {
        let n = needles();
        let text = format!("{}{TOKEN}{}", "a".repeat(5000), "b".repeat(5000));
        for size in [1, 7, 64, 4096] {
            let mut s = n.stream();
            for piece in text.as_bytes().chunks(size) {
                s.feed(piece);
            }
            assert_eq!(s.found().map(|f| f.form), Some("as it is"), "{size}");
        }
        let mut clean = n.stream();
        for piece in "nothing here".as_bytes().chunks(3) {
            clean.feed(piece);
        }
        assert_eq!(clean.found(), None);
        assert!(Needles::new([("A", "x")]).is_empty());
    }
}
