//! The records' index in the SQLite file: the `records` table, with an index for each filter (each
//! ordered newest first within it), and the `counters` table.

use rusqlite::types::Value;
use rusqlite::{OptionalExtension as _, TransactionBehavior, params, params_from_iter};

use crate::records::{Cursor, FoundRecord, RecordEntry, RecordFilter, RecordIndex};
use crate::sqlite::sqlite;
use crate::{QueueError, SqliteQueue};

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The search's `WHERE` clause and its values: only the conditions given, so that SQLite picks the
/// index of the one that narrows most.
fn conditions(filter: &RecordFilter, after: Option<&Cursor>) -> (String, Vec<Value>) {
    let mut clauses: Vec<&str> = Vec::new();
    let mut values: Vec<Value> = Vec::new();
    let reason_none = matches!(filter.reason, Some(None));
    let texts = [
        ("outcome = ?", &filter.outcome),
        ("reason = ?", filter.reason.as_ref().unwrap_or(&None)),
        ("trigger_type = ?", &filter.trigger_type),
        ("repo = ?", &filter.repo),
        ("folder = ?", &filter.folder),
    ];
    for (clause, value) in texts {
        if let Some(v) = value {
            clauses.push(clause);
            values.push(Value::Text(v.clone()));
        }
    }
    if reason_none {
        clauses.push("reason IS NULL");
    }
    if let Some(i) = filter.trigger_index {
        clauses.push("trigger_index = ?");
        values.push(Value::Integer(int(i)));
    }
    if let Some(since) = filter.since_ms {
        clauses.push("finished_at >= ?");
        values.push(Value::Integer(int(since)));
    }
    if let Some(c) = after {
        clauses.push("(finished_at, id) < (?, ?)");
        values.push(Value::Integer(int(c.finished_at_ms)));
        values.push(Value::Text(c.id.clone()));
    }
    let sql = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    (sql, values)
}

impl SqliteQueue {
    /// `columns` of at most `limit` records the filter finds, newest first, after `after`.
    fn search<T>(
        &self,
        columns: &str,
        filter: &RecordFilter,
        after: Option<&Cursor>,
        limit: usize,
        row: impl Fn(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>, QueueError> {
        let (clause, mut values) = conditions(filter, after);
        values.push(Value::Integer(int(limit as u64)));
        let sql = format!(
            "SELECT {columns} FROM records {clause} ORDER BY finished_at DESC, id DESC LIMIT ?"
        );
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&sql)
            .map_err(sqlite("search the records"))?;
        let rows = stmt
            .query_map(params_from_iter(values), row)
            .map_err(sqlite("search the records"))?;
        rows.collect::<Result<_, _>>()
            .map_err(sqlite("read the records found"))
    }
}

impl RecordIndex for SqliteQueue {
    fn put_record(&self, entry: &RecordEntry<'_>) -> Result<bool, QueueError> {
        Ok(self.put_records(std::slice::from_ref(entry))? == 1)
    }

    fn put_records(&self, entries: &[RecordEntry<'_>]) -> Result<usize, QueueError> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite("begin storing records"))?;
        let mut stored = 0;
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO records (id, finished_at, outcome, reason, trigger_index,
                         trigger_type, repo, folder, body)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (id) DO NOTHING",
                )
                .map_err(sqlite("store a record"))?;
            let mut add = tx
                .prepare_cached(
                    "INSERT INTO counters (series, value) VALUES (?1, ?2)
                     ON CONFLICT (series) DO UPDATE SET value = value + excluded.value",
                )
                .map_err(sqlite("count a record"))?;
            for entry in entries {
                let k = entry.keys;
                let added = insert
                    .execute(params![
                        entry.id,
                        int(k.finished_at_ms),
                        k.outcome,
                        k.reason,
                        k.trigger_index.map(int),
                        k.trigger_type,
                        k.repo,
                        k.folder,
                        entry.text
                    ])
                    .map_err(sqlite("store a record"))?;
                if added == 1 {
                    stored += 1;
                    for (series, amount) in entry.counts {
                        add.execute(params![series, amount])
                            .map_err(sqlite("count a record"))?;
                    }
                }
            }
        }
        tx.execute(
            "UPDATE records_kept SET n = n + ?1",
            params![int(stored as u64)],
        )
        .map_err(sqlite("count the records"))?;
        tx.commit().map_err(sqlite("commit records"))?;
        Ok(stored)
    }

    fn get_record(&self, id: &str) -> Result<Option<String>, QueueError> {
        self.conn()
            .query_row(
                "SELECT body FROM records WHERE id = ?1",
                params![id],
                |row| row.get(0),
            )
            .optional()
            .map_err(sqlite("read a record"))
    }

    fn find_records(
        &self,
        filter: &RecordFilter,
        after: Option<&Cursor>,
        limit: usize,
    ) -> Result<Vec<FoundRecord>, QueueError> {
        self.search("id, finished_at, body", filter, after, limit, |row| {
            Ok(FoundRecord {
                id: row.get(0)?,
                finished_at_ms: u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
                text: Some(row.get(2)?),
            })
        })
    }

    fn find_times(&self, filter: &RecordFilter, limit: usize) -> Result<Vec<u64>, QueueError> {
        self.search("finished_at", filter, None, limit, |row| {
            Ok(u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0))
        })
    }

    fn count_records(&self) -> Result<u64, QueueError> {
        self.conn()
            .query_row("SELECT n FROM records_kept", [], |row| row.get::<_, i64>(0))
            .map(|n| u64::try_from(n).unwrap_or(0))
            .map_err(sqlite("count the records"))
    }

    fn count_records_before(&self, before_ms: u64) -> Result<u64, QueueError> {
        self.conn()
            .query_row(
                "SELECT count(*) FROM records WHERE finished_at < ?1",
                params![int(before_ms)],
                |row| row.get::<_, i64>(0),
            )
            .map(|n| u64::try_from(n).unwrap_or(0))
            .map_err(sqlite("count the old records"))
    }

    fn prune_records(&self, before_ms: u64, max: usize) -> Result<Vec<String>, QueueError> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite("begin pruning records"))?;
        let ids = {
            let mut stmt = tx
                .prepare(
                    "DELETE FROM records WHERE id IN (
                         SELECT id FROM records WHERE finished_at < ?1
                         ORDER BY finished_at, id LIMIT ?2)
                     RETURNING id",
                )
                .map_err(sqlite("prune records"))?;
            let rows = stmt
                .query_map(params![int(before_ms), int(max as u64)], |row| row.get(0))
                .map_err(sqlite("prune records"))?;
            rows.collect::<Result<Vec<String>, _>>()
                .map_err(sqlite("prune records"))?
        };
        tx.execute(
            "UPDATE records_kept SET n = n - ?1",
            params![int(ids.len() as u64)],
        )
        .map_err(sqlite("count the records"))?;
        tx.commit().map_err(sqlite("commit pruning records"))?;
        Ok(ids)
    }

    fn counters(&self) -> Result<Vec<(String, f64)>, QueueError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached("SELECT series, value FROM counters ORDER BY series")
            .map_err(sqlite("read the counters"))?;
        let rows = stmt
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .map_err(sqlite("read the counters"))?;
        rows.collect::<Result<_, _>>()
            .map_err(sqlite("read the counters"))
    }

    fn unindexed_records(&self, _max: usize) -> Result<Vec<(String, Option<String>)>, QueueError> {
        Ok(Vec::new())
    }
}
