//! What an operator asks of the records: the newest first, at most so many, by outcome, reason,
//! trigger, repository or folder, and since when. One query, read from the command line's words
//! (or the panel's), and answered by the store's index (`Records::find`).

use std::time::Duration;

use crate::record::{Outcome, Reason};

/// How many records `runs` shows when not told.
pub const DEFAULT_LIMIT: usize = 50;
/// The most one query returns.
pub const MAX_LIMIT: usize = 1_000_000;

/// A query of the records. Every condition given must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub limit: usize,
    pub outcome: Option<Outcome>,
    pub reason: Option<ReasonIs>,
    pub trigger: Option<TriggerIs>,
    /// A forge job's repository, `owner/name` (`group/project` on GitLab).
    pub repo: Option<String>,
    /// A local job's folder, as the job named it.
    pub folder: Option<String>,
    /// Only records of jobs that ended at or after this (Unix ms).
    pub since_ms: Option<u64>,
}

impl Default for Query {
    fn default() -> Query {
        Query {
            limit: DEFAULT_LIMIT,
            outcome: None,
            reason: None,
            trigger: None,
            repo: None,
            folder: None,
            since_ms: None,
        }
    }
}

/// A record's reason: one of the table's, or none (a completed job).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasonIs {
    None,
    Is(Reason),
}

/// A trigger, by its index in `triggers.json` or by what started the job (`cron`, `cli`, a
/// forge event's type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TriggerIs {
    Index(usize),
    Type(String),
}

/// Why a query's word was refused: the option, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("--outcome is one of completed, failed, policy, cancelled")]
    Outcome,
    #[error("--reason is a reason pi-dispatch records (see docs/worker.md), or none")]
    Reason,
    #[error("--since is a duration such as 30m, 12h, 7d or 2w")]
    Since,
    #[error("--repo is OWNER/NAME")]
    Repo,
}

impl Query {
    /// The outcome a word names.
    pub fn outcome(word: &str) -> Result<Outcome, QueryError> {
        [
            Outcome::Completed,
            Outcome::Failed,
            Outcome::Policy,
            Outcome::Cancelled,
        ]
        .into_iter()
        .find(|o| o.as_str() == word)
        .ok_or(QueryError::Outcome)
    }

    /// A reason's token, or `none`.
    pub fn reason(word: &str) -> Result<ReasonIs, QueryError> {
        match word {
            "none" => Ok(ReasonIs::None),
            _ => Reason::parse(word)
                .map(ReasonIs::Is)
                .ok_or(QueryError::Reason),
        }
    }

    pub fn trigger(word: &str) -> TriggerIs {
        match word.parse() {
            Ok(index) if word.bytes().all(|b| b.is_ascii_digit()) => TriggerIs::Index(index),
            _ => TriggerIs::Type(word.to_owned()),
        }
    }

    pub fn repo(word: &str) -> Result<String, QueryError> {
        let ok = word.split_once('/').is_some_and(|(owner, name)| {
            !owner.is_empty() && !name.is_empty() && !word.contains(['#', '!'])
        });
        ok.then(|| word.to_owned()).ok_or(QueryError::Repo)
    }

    /// A duration as `N` and a unit: `s`, `m`, `h`, `d` or `w`.
    pub fn since(word: &str) -> Result<Duration, QueryError> {
        let unit = word.chars().last().ok_or(QueryError::Since)?;
        let count: u64 = word[..word.len() - unit.len_utf8()]
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or(QueryError::Since)?;
        let secs = match unit {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            'w' => 7 * 86_400,
            _ => return Err(QueryError::Since),
        };
        count
            .checked_mul(secs)
            .map(Duration::from_secs)
            .ok_or(QueryError::Since)
    }

    /// The query's conditions, as the store searches by them.
    pub fn filter(&self) -> queue::RecordFilter {
        queue::RecordFilter {
            outcome: self.outcome.map(|o| o.as_str().to_owned()),
            reason: self.reason.map(|r| match r {
                ReasonIs::None => None,
                ReasonIs::Is(r) => Some(r.as_str().to_owned()),
            }),
            trigger_index: match &self.trigger {
                Some(TriggerIs::Index(i)) => Some(*i as u64),
                _ => None,
            },
            trigger_type: match &self.trigger {
                Some(TriggerIs::Type(t)) => Some(t.clone()),
                _ => None,
            },
            repo: self.repo.clone(),
            folder: self.folder.clone(),
            since_ms: self.since_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_read_strictly_and_a_refusal_names_the_option_only() {
        assert_eq!(Query::outcome("failed"), Ok(Outcome::Failed));
        assert_eq!(
            Query::reason("time-limit"),
            Ok(ReasonIs::Is(Reason::TimeLimit))
        );
        assert_eq!(Query::reason("none"), Ok(ReasonIs::None));
        assert_eq!(Query::since("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(Query::since("2w"), Ok(Duration::from_secs(14 * 86_400)));
        for bad in ["", "m", "0d", "-1d", "3y", "1.5h", "99999999999999999w"] {
            assert_eq!(Query::since(bad), Err(QueryError::Since), "{bad}");
        }
        assert_eq!(Query::repo("octo/hello").as_deref(), Ok("octo/hello"));
        for bad in ["octo", "/hello", "octo/", "octo/hello#3"] {
            assert_eq!(Query::repo(bad), Err(QueryError::Repo), "{bad}");
        }
        let e = Query::outcome("cnry-value").unwrap_err().to_string();
        assert!(e.contains("--outcome") && !e.contains("cnry"), "{e}");
        assert_eq!(Query::trigger("12"), TriggerIs::Index(12));
        assert_eq!(Query::trigger("cron"), TriggerIs::Type("cron".into()));
    }
}
