//! The records' index in Redis: each record's text (`record:ID`), a zset of the records by when
//! their jobs ended (`records`) and one for each value of each filter (`records:outcome:failed`,
//! ...), so that a search walks the zset of its narrowest condition, newest first, and checks the
//! others by membership, in a script that looks at a bounded number of records a call.

use crate::records::{Cursor, FoundRecord, RecordEntry, RecordFilter, RecordIndex, RecordKeys};
use std::sync::LazyLock;

use redis::Script;

use crate::redis_queue::{PREFIX, PRELUDE};
use crate::{QueueError, RedisQueue};

/// ARGV: prefix, id, text, when, the number of zsets, the zsets, then each counter's series and
/// amount. A record is written once; one stored by a version without the index is indexed now
/// (its text stays). Answers 1 when the record was stored now.
const PUT_RECORD: &str = r"
local id = ARGV[2]
local ik = p .. 'record-index:' .. id
if redis.call('EXISTS', ik) == 1 then return 0 end
local stored = redis.call('SET', p .. 'record:' .. id, ARGV[3], 'NX')
local n = tonumber(ARGV[5])
for i = 6, 5 + n do
  redis.call('ZADD', p .. ARGV[i], 'NX', ARGV[4], id)
  redis.call('RPUSH', ik, ARGV[i])
end
for i = 6 + n, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', p .. 'counters', ARGV[i], ARGV[i + 1])
end
if stored then return 1 end
return 0
";

/// ARGV: prefix, the zset walked, the limit, how many records to look at, the cursor's id and
/// score ('' for none), the earliest time ('' for none), then the zsets a record must also be in.
/// Answers: whether more may follow, the last record looked at (id, score), and the records found
/// (id, score, ...).
const FIND_RECORDS: &str = r"
local main = p .. ARGV[2]
local limit = tonumber(ARGV[3])
local budget = tonumber(ARGV[4])
local since = tonumber(ARGV[7])
local start = 0
if ARGV[5] ~= '' then
  local r = redis.call('ZREVRANK', main, ARGV[5])
  -- A cursor pruned meanwhile: start after every record as old as it.
  if r then start = r + 1 else start = redis.call('ZCOUNT', main, ARGV[6], '+inf') end
end
local found = {}
local last_id, last_score = '', ''
local looked = 0
while looked < budget do
  local batch = redis.call('ZREVRANGE', main, start, start + 199, 'WITHSCORES')
  if #batch == 0 then return {0, last_id, last_score, found} end
  for i = 1, #batch, 2 do
    local id, score = batch[i], batch[i + 1]
    if since and tonumber(score) < since then return {0, last_id, last_score, found} end
    looked = looked + 1
    last_id, last_score = id, score
    local ok = true
    for j = 8, #ARGV do
      if not redis.call('ZSCORE', p .. ARGV[j], id) then ok = false break end
    end
    if ok then
      found[#found + 1] = id
      found[#found + 1] = score
      if #found / 2 >= limit then return {1, last_id, last_score, found} end
    end
  end
  start = start + 200
end
return {1, last_id, last_score, found}
";

/// ARGV: prefix, before, max. Removes the oldest records of jobs that ended before `before` from
/// every zset they are in; answers their ids.
const PRUNE_RECORDS: &str = r"
local ids = redis.call('ZRANGEBYSCORE', p .. 'records', '-inf', '(' .. ARGV[2], 'LIMIT', 0, ARGV[3])
for _, id in ipairs(ids) do
  local ik = p .. 'record-index:' .. id
  for _, s in ipairs(redis.call('LRANGE', ik, 0, -1)) do redis.call('ZREM', p .. s, id) end
  redis.call('ZREM', p .. 'records', id)
  redis.call('DEL', ik, p .. 'record:' .. id)
end
return ids
";

/// A script with the prelude every script starts with.
fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

static PUT: LazyLock<Script> = LazyLock::new(|| script(PUT_RECORD));
static FIND: LazyLock<Script> = LazyLock::new(|| script(FIND_RECORDS));
static PRUNE: LazyLock<Script> = LazyLock::new(|| script(PRUNE_RECORDS));

/// How many records one call of the search script looks at, so that no call holds Redis long.
const LOOK_AT: usize = 5_000;

/// The zsets a record with these keys is in (each under the prefix).
fn zsets(k: &RecordKeys) -> Vec<String> {
    let mut sets = vec!["records".to_owned()];
    let mut add = |field: &str, value: Option<&str>| {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            sets.push(format!("records:{field}:{v}"));
        }
    };
    add("outcome", Some(&k.outcome));
    add("reason", Some(k.reason.as_deref().unwrap_or("none")));
    add(
        "trigger-index",
        k.trigger_index.map(|i| i.to_string()).as_deref(),
    );
    add("trigger-type", Some(&k.trigger_type));
    add("repo", k.repo.as_deref());
    add("folder", k.folder.as_deref());
    sets
}

/// The zsets a search's conditions name, narrowest first (the first is walked).
fn wanted(f: &RecordFilter) -> Vec<String> {
    let mut sets = Vec::new();
    if let Some(Some(reason)) = &f.reason {
        sets.push(format!("records:reason:{reason}"));
    }
    if let Some(repo) = &f.repo {
        sets.push(format!("records:repo:{repo}"));
    }
    if let Some(folder) = &f.folder {
        sets.push(format!("records:folder:{folder}"));
    }
    if let Some(i) = f.trigger_index {
        sets.push(format!("records:trigger-index:{i}"));
    }
    if let Some(t) = &f.trigger_type {
        sets.push(format!("records:trigger-type:{t}"));
    }
    if let Some(None) = &f.reason {
        sets.push("records:reason:none".to_owned());
    }
    if let Some(o) = &f.outcome {
        sets.push(format!("records:outcome:{o}"));
    }
    sets
}

/// The script's arguments for storing `entry` (after the prefix).
fn put_args(entry: &RecordEntry<'_>) -> Vec<String> {
    let sets = zsets(entry.keys);
    let mut args = vec![
        entry.id.to_owned(),
        entry.text.to_owned(),
        entry.keys.finished_at_ms.to_string(),
        sets.len().to_string(),
    ];
    args.extend(sets);
    for (series, amount) in entry.counts {
        args.push(series.clone());
        args.push(amount.to_string());
    }
    args
}

fn score(text: &str) -> u64 {
    text.parse::<f64>().map_or(0, |s| s as u64)
}

impl RedisQueue {
    /// The texts of records `ids`, in their order.
    fn texts(&self, ids: &[String]) -> Result<Vec<Option<String>>, QueueError> {
        let mut texts = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let keys: Vec<String> = chunk
                .iter()
                .map(|id| format!("{PREFIX}record:{id}"))
                .collect();
            let part: Vec<Option<String>> = self.call("read the records", |c| {
                redis::cmd("MGET").arg(&keys).query(c)
            })?;
            texts.extend(part);
        }
        Ok(texts)
    }
}

type Page = (i64, String, String, Vec<String>);

impl RedisQueue {
    /// The ids of at most `limit` records the filter finds, newest first, after `after`, each
    /// with when its job ended.
    fn find_ids(
        &self,
        filter: &RecordFilter,
        after: Option<&Cursor>,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, QueueError> {
        let mut sets = wanted(filter);
        let main = if sets.is_empty() {
            "records".to_owned()
        } else {
            sets.remove(0)
        };
        let mut cursor = after.map(|c| (c.id.clone(), c.finished_at_ms.to_string()));
        let mut found: Vec<(String, u64)> = Vec::new();
        while found.len() < limit {
            let (id, at) = cursor.clone().unwrap_or_default();
            let mut args = vec![
                main.clone(),
                (limit - found.len()).to_string(),
                LOOK_AT.to_string(),
                id,
                at,
                filter.since_ms.map(|s| s.to_string()).unwrap_or_default(),
            ];
            args.extend(sets.iter().cloned());
            let (more, last_id, last_score, page): Page =
                self.run("search the records", &FIND, &args)?;
            for pair in page.chunks(2) {
                if let [id, at] = pair {
                    found.push((id.clone(), score(at)));
                }
            }
            if more == 0 || last_id.is_empty() {
                break;
            }
            cursor = Some((last_id, last_score));
        }
        Ok(found)
    }
}

impl RecordIndex for RedisQueue {
    fn put_record(&self, entry: &RecordEntry<'_>) -> Result<bool, QueueError> {
        let stored: i64 = self.run("store a record", &PUT, &put_args(entry))?;
        Ok(stored == 1)
    }

    fn put_records(&self, entries: &[RecordEntry<'_>]) -> Result<usize, QueueError> {
        let hash = self.call("load the record script", |c| PUT.prepare_invoke().load(c))?;
        let mut stored = 0;
        for chunk in entries.chunks(500) {
            let answers: Vec<i64> = self.call("store records", |c| {
                let mut pipe = redis::pipe();
                for entry in chunk {
                    let cmd = pipe.cmd("EVALSHA").arg(&hash).arg(0).arg(PREFIX);
                    for a in put_args(entry) {
                        cmd.arg(a);
                    }
                }
                pipe.query(c)
            })?;
            stored += answers.iter().filter(|a| **a == 1).count();
        }
        Ok(stored)
    }

    fn get_record(&self, id: &str) -> Result<Option<String>, QueueError> {
        self.call("read a record", |c| {
            redis::cmd("GET")
                .arg(format!("{PREFIX}record:{id}"))
                .query(c)
        })
    }

    fn find_records(
        &self,
        filter: &RecordFilter,
        after: Option<&Cursor>,
        limit: usize,
    ) -> Result<Vec<FoundRecord>, QueueError> {
        let found = self.find_ids(filter, after, limit)?;
        let ids: Vec<String> = found.iter().map(|(id, _)| id.clone()).collect();
        let texts = self.texts(&ids)?;
        Ok(found
            .into_iter()
            .zip(texts)
            .map(|((id, finished_at_ms), text)| FoundRecord {
                id,
                finished_at_ms,
                text,
            })
            .collect())
    }

    fn find_times(&self, filter: &RecordFilter, limit: usize) -> Result<Vec<u64>, QueueError> {
        Ok(self
            .find_ids(filter, None, limit)?
            .into_iter()
            .map(|(_, at)| at)
            .collect())
    }

    fn count_records(&self) -> Result<u64, QueueError> {
        self.call("count the records", |c| {
            redis::cmd("ZCARD").arg(format!("{PREFIX}records")).query(c)
        })
    }

    fn count_records_before(&self, before_ms: u64) -> Result<u64, QueueError> {
        self.call("count the old records", |c| {
            redis::cmd("ZCOUNT")
                .arg(format!("{PREFIX}records"))
                .arg("-inf")
                .arg(format!("({before_ms}"))
                .query(c)
        })
    }

    fn prune_records(&self, before_ms: u64, max: usize) -> Result<Vec<String>, QueueError> {
        self.run(
            "prune records",
            &PRUNE,
            &[before_ms.to_string(), max.to_string()],
        )
    }

    fn counters(&self) -> Result<Vec<(String, f64)>, QueueError> {
        let all: Vec<(String, String)> = self.call("read the counters", |c| {
            redis::cmd("HGETALL")
                .arg(format!("{PREFIX}counters"))
                .query(c)
        })?;
        let mut counters: Vec<(String, f64)> = all
            .into_iter()
            .map(|(series, v)| (series, v.parse().unwrap_or(0.0)))
            .collect();
        counters.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(counters)
    }

    fn unindexed_records(&self, max: usize) -> Result<Vec<(String, Option<String>)>, QueueError> {
        let done_key = format!("{PREFIX}records-indexed");
        let done: bool = self.call("read the records' index version", |c| {
            redis::cmd("EXISTS").arg(&done_key).query(c)
        })?;
        if done {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = self.call("list the records", |c| {
            redis::cmd("ZRANGE")
                .arg(format!("{PREFIX}records"))
                .arg(0)
                .arg(-1)
                .query(c)
        })?;
        let mut missing = Vec::new();
        for chunk in ids.chunks(500) {
            let indexed: Vec<bool> = self.call("look for the records' index", |c| {
                let mut pipe = redis::pipe();
                for id in chunk {
                    pipe.cmd("EXISTS").arg(format!("{PREFIX}record-index:{id}"));
                }
                pipe.query(c)
            })?;
            missing.extend(
                chunk
                    .iter()
                    .zip(indexed)
                    .filter(|(_, indexed)| !indexed)
                    .map(|(id, _)| id.clone()),
            );
            if missing.len() >= max {
                missing.truncate(max);
                break;
            }
        }
        if missing.is_empty() {
            self.call("mark the records indexed", |c| {
                redis::cmd("SET").arg(&done_key).arg(1).query::<()>(c)
            })?;
            return Ok(Vec::new());
        }
        let texts = self.texts(&missing)?;
        Ok(missing.into_iter().zip(texts).collect())
    }
}
