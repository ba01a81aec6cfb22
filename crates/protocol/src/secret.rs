//! The one type for a value that must not be seen: a provider's key, a forge token, a resolved
//! reference, a webhook secret. `Debug` and `Display` print `***` whatever it holds, and its memory
//! is wiped when it is dropped; the value comes out only through [`Secret::expose`], at the one place
//! that hands it on.

use std::fmt;

use zeroize::Zeroizing;

#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(Zeroizing::new(value.into()))
    }

    /// The value itself, for the one place that hands it on.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_never_shown() {
        let s = Secret::new("cnry-secret-3f9");
        assert_eq!(format!("{s:?} {s} {s:#?}"), "Secret(***) *** Secret(***)");
        assert_eq!(s.expose(), "cnry-secret-3f9");
        assert!(!s.is_empty());
        assert!(Secret::default().is_empty());
    }
}
