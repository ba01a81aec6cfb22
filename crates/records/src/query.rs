//! What an operator asks of the records: the newest first, at most so many, by outcome, reason,
//! trigger, repository or folder, and since when. One query, read from the command line's words
//! and answered over any list of records, so that every store answers it alike.

use std::time::Duration;

use crate::record::{Outcome, Reason, Record};

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

    /// Whether `r` is one the query asks for (the limit aside).
    pub fn matches(&self, r: &Record) -> bool {
        let repo_of = |item: &str| item.split(['#', '!']).next().map(str::to_owned);
        self.outcome.is_none_or(|o| r.outcome == o)
            && self.reason.is_none_or(|reason| match reason {
                ReasonIs::None => r.reason.is_none(),
                ReasonIs::Is(reason) => r.reason == Some(reason),
            })
            && self.trigger.as_ref().is_none_or(|t| match t {
                TriggerIs::Index(i) => r.trigger_index == Some(*i),
                TriggerIs::Type(name) => &r.trigger_type == name,
            })
            && self
                .repo
                .as_ref()
                .is_none_or(|repo| r.item.as_deref().and_then(repo_of).as_ref() == Some(repo))
            && self
                .folder
                .as_ref()
                .is_none_or(|f| r.folder.as_ref() == Some(f))
            && self.since_ms.is_none_or(|since| r.finished_at_ms >= since)
    }

    /// The records the query asks for out of `all`: the newest first (by when they ended, then by
    /// id), at most `limit`.
    pub fn answer(&self, all: Vec<Record>) -> Vec<Record> {
        let mut found: Vec<Record> = all.into_iter().filter(|r| self.matches(r)).collect();
        found.sort_by(|a, b| {
            b.finished_at_ms
                .cmp(&a.finished_at_ms)
                .then_with(|| b.job_id.cmp(&a.job_id))
        });
        found.truncate(self.limit);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::job::Job;

    fn record(id: &str, outcome: Outcome, reason: Option<Reason>, at: u64) -> Record {
        let mut job = Job::new(id, "cron", "local");
        job.trigger_index = Some(1);
        job.folder = Some("/srv/repo".into());
        Record::new(&job, outcome, reason, 1, at)
    }

    #[test]
    fn the_newest_come_first_and_every_condition_must_hold() {
        let mut forge = record("gh-1", Outcome::Failed, Some(Reason::TimeLimit), 30);
        forge.item = Some("octo/hello#4".into());
        forge.folder = None;
        forge.trigger_type = "label".into();
        forge.trigger_index = Some(0);
        let all = vec![
            record("a", Outcome::Completed, None, 10),
            record("b", Outcome::Failed, Some(Reason::TimeLimit), 20),
            forge,
            record("c", Outcome::Policy, Some(Reason::McpServerUnknown), 40),
        ];
        let ids = |q: &Query| -> Vec<String> {
            q.answer(all.clone())
                .into_iter()
                .map(|r| r.job_id)
                .collect()
        };
        assert_eq!(ids(&Query::default()), ["c", "gh-1", "b", "a"]);
        let limit = Query {
            limit: 2,
            ..Query::default()
        };
        assert_eq!(ids(&limit), ["c", "gh-1"]);
        let failed = Query {
            outcome: Some(Outcome::Failed),
            ..Query::default()
        };
        assert_eq!(ids(&failed), ["gh-1", "b"]);
        let timed_out_locally = Query {
            reason: Some(ReasonIs::Is(Reason::TimeLimit)),
            folder: Some("/srv/repo".into()),
            ..Query::default()
        };
        assert_eq!(ids(&timed_out_locally), ["b"]);
        let repo = Query {
            repo: Some("octo/hello".into()),
            ..Query::default()
        };
        assert_eq!(ids(&repo), ["gh-1"]);
        let by_index = Query {
            trigger: Some(Query::trigger("0")),
            ..Query::default()
        };
        assert_eq!(ids(&by_index), ["gh-1"]);
        let by_type = Query {
            trigger: Some(Query::trigger("cron")),
            since_ms: Some(20),
            ..Query::default()
        };
        assert_eq!(ids(&by_type), ["c", "b"]);
        let no_reason = Query {
            reason: Some(ReasonIs::None),
            ..Query::default()
        };
        assert_eq!(ids(&no_reason), ["a"]);
    }

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
