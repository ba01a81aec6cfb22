//! Times as both backends store them: Unix milliseconds in an `i64`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `t` as Unix milliseconds (0 before 1970).
pub(crate) fn of(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Unix milliseconds `ms` as a time (1970 for a negative value).
pub(crate) fn time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// `d` after `ms`, in milliseconds.
pub(crate) fn later(ms: i64, d: Duration) -> i64 {
    ms.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Before when a worker last seen is forgotten, at `now`.
pub(crate) fn forget_before(now: SystemTime) -> i64 {
    of(now
        .checked_sub(crate::FORGET_WORKERS_AFTER)
        .unwrap_or(UNIX_EPOCH))
}
