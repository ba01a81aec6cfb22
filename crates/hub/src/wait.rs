//! How long the runner waits for every server to list its tools: 15 s, or the largest server
//! timeout when that is longer, never more than 120 s.

use std::time::Duration;

pub const MIN_WAIT: Duration = Duration::from_secs(15);
pub const MAX_WAIT: Duration = Duration::from_secs(120);

pub fn budget(timeouts: impl IntoIterator<Item = Option<u16>>) -> Duration {
    let longest = timeouts
        .into_iter()
        .flatten()
        .map(|t| Duration::from_secs(u64::from(t)))
        .max()
        .unwrap_or(Duration::ZERO);
    longest.clamp(MIN_WAIT, MAX_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifteen_seconds_or_the_longest_timeout_up_to_two_minutes() {
        assert_eq!(budget([]), MIN_WAIT);
        assert_eq!(budget([None, Some(5)]), MIN_WAIT);
        assert_eq!(budget([Some(30), Some(60)]), Duration::from_secs(60));
        assert_eq!(budget([Some(600)]), MAX_WAIT);
    }
}
