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

/// How long pi's MCP client waits for a server's answer when the entry sets no `timeout`.
pub const PI_DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether pi may start while the servers connect. pi's `initialize` to a server that answered
/// early is held until every server has, so that must never outlast pi's own wait for that server
/// (its `timeout`, else pi's default): it cannot when no server's wait in pi is shorter than the
/// runner's.
pub fn pi_may_start_alongside(timeouts: &[Option<u16>]) -> bool {
    let wait = budget(timeouts.iter().copied());
    timeouts
        .iter()
        .all(|t| t.map_or(PI_DEFAULT_TIMEOUT, |s| Duration::from_secs(u64::from(s))) >= wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pi_starts_alongside_only_when_no_server_of_its_would_give_up_first() {
        assert!(pi_may_start_alongside(&[]));
        assert!(pi_may_start_alongside(&[None, None]));
        // 20 s of waiting, pi waits 60 s or 20 s.
        assert!(pi_may_start_alongside(&[None, Some(20)]));
        // A server's 5 s in pi against the runner's 15 s.
        assert!(!pi_may_start_alongside(&[None, Some(5)]));
        // The runner waits 90 s for one; pi's default 60 s for the other would run out first.
        assert!(!pi_may_start_alongside(&[None, Some(90)]));
        // The runner waits 100 s: pi's 90 s for the first would run out first; 100 s would not.
        assert!(!pi_may_start_alongside(&[Some(90), Some(100)]));
        assert!(pi_may_start_alongside(&[Some(100), Some(100)]));
    }

    #[test]
    fn fifteen_seconds_or_the_longest_timeout_up_to_two_minutes() {
        assert_eq!(budget([]), MIN_WAIT);
        assert_eq!(budget([None, Some(5)]), MIN_WAIT);
        assert_eq!(budget([Some(30), Some(60)]), Duration::from_secs(60));
        assert_eq!(budget([Some(600)]), MAX_WAIT);
    }
}
