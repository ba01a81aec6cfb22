//! The queue in Redis (or Valkey), for workers on several hosts. Every change is one Lua script,
//! which Redis runs whole with nothing between its steps, so a worker killed at any point leaves a
//! job leased or queued, never both and never gone. The states, leases, attempts and backoff are
//! the SQLite queue's, step for step; one test suite runs against both.
//!
//! Keys, all under one prefix (`pi-dispatch:`), in the database the URL names:
//!
//! ```text
//! job:ID      hash: seq, payload, state, attempt, queued_at, available_at, worker, token,
//!             leased_until, leased_at, finished_at, outcome, cancel (0 or 1), needs (a JSON
//!             array of labels, absent for any worker), group
//! seq         the enqueue counter
//! open        zset of the jobs not done, by seq (the order they are leased in)
//! leased      zset of the leased jobs, by leased_until (where lapsed leases are found)
//! lost        zset of the lost jobs, by seq, until take_lost reports them
//! done        zset of the done jobs, by finished_at
//! deliveries  zset of the forge deliveries seen, by when
//! group:G     zset of the open jobs of group G, by seq (only the first may be leased)
//! workers     hash of the workers' cards (JSON), by worker id; workers-seen, zset of when each
//!             was last seen
//! reruns:ID   list of the jobs that ran job ID again
//! live:ID     hash: snapshot, updated (what a running job shows); live-lines:ID, list of its
//!             transcript's lines so far; live, zset of the jobs by updated (a week's expiry too)
//! lease:TOKEN the job a lease took, for as long as the lease (a lease asked again after a lost
//!             answer gets the same job)
//! record:ID   a job's record, as text
//! records     zset of the records, by when their jobs ended; records:FIELD:VALUE the same for
//!             each filter (outcome, reason, trigger-index, trigger-type, repo, folder)
//! record-index:ID  list of the zsets record ID is in (what pruning removes it from)
//! counters    hash of the deployment's counters, which each record adds to
//! pins        hash of each MCP server's pin, by server name; pin-drift, hash of the drift the
//!             last job saw from it, until approved
//! ```
//!
//! Times are unix milliseconds, passed in as everywhere in the queue. A connection that breaks is
//! opened again, and the operation tried again, for up to the outage limit (a Redis restart, a short
//! network fault); the worker waits meanwhile rather than dropping a job. Not for Redis Cluster: the
//! scripts name keys they compute.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use redis::{Connection, RedisError, Script, Value};

use crate::millis;
use crate::stored::{self, Stored};
use crate::{
    Cancel, Config, DoneJob, End, Lease, LeaseState, LiveView, LostJob, NewJob, OpenJob, OpenState,
    Placement, Queue, QueueError, RetryDecision, Status, WorkerCard, WorkerSeen,
};

/// Every key's prefix.
pub const PREFIX: &str = "pi-dispatch:";

/// How long an operation waits for Redis to come back before it fails.
pub const DEFAULT_OUTAGE_LIMIT: Duration = Duration::from_secs(60);

/// How long opening the queue waits for a Redis that does not answer: a command (or a worker
/// starting) is told at once where Redis was looked for, rather than after a whole outage's wait.
pub const FIRST_CONTACT_LIMIT: Duration = Duration::from_secs(6);

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// What every script starts with: the prefix (first argument) and the steps they share.
pub(crate) const PRELUDE: &str = r"
local p = ARGV[1]
local function jk(id) return p .. 'job:' .. id end
local function num(v) return tonumber(v) or 0 end
-- needs: a JSON array, or '' for any worker; group: '' for none; supersede: '1' marks the
-- group's other jobs for cancelling (a queued one is lost at once, and reported cancelled).
local function enqueue(id, payload, now, needs, group, supersede)
  local k = jk(id)
  if redis.call('EXISTS', k) == 1 then return 0 end
  local seq = redis.call('INCR', p .. 'seq')
  redis.call('HSET', k, 'seq', seq, 'payload', payload, 'state', 'queued', 'attempt', 0,
    'queued_at', now, 'available_at', now, 'cancel', 0)
  if needs ~= '' then redis.call('HSET', k, 'needs', needs) end
  if group ~= '' then
    local gk = p .. 'group:' .. group
    if supersede == '1' then
      for _, other in ipairs(redis.call('ZRANGE', gk, 0, -1)) do
        local ok = jk(other)
        local st = redis.call('HGET', ok, 'state')
        if st == 'queued' then
          redis.call('HSET', ok, 'state', 'lost', 'cancel', 1)
          redis.call('HDEL', ok, 'token', 'leased_until')
          redis.call('ZADD', p .. 'lost', num(redis.call('HGET', ok, 'seq')), other)
        elseif st == 'leased' then
          redis.call('HSET', ok, 'cancel', 1)
        end
      end
    end
    redis.call('HSET', k, 'group', group)
    redis.call('ZADD', gk, seq, id)
  end
  redis.call('ZADD', p .. 'open', seq, id)
  return 1
end
local function done(id, outcome, now)
  local k = jk(id)
  local group = redis.call('HGET', k, 'group')
  if group then redis.call('ZREM', p .. 'group:' .. group, id) end
  redis.call('HSET', k, 'state', 'done', 'outcome', outcome, 'finished_at', now, 'payload', '')
  redis.call('HDEL', k, 'token', 'leased_until')
  redis.call('ZREM', p .. 'open', id)
  redis.call('ZREM', p .. 'leased', id)
  redis.call('ZREM', p .. 'lost', id)
  redis.call('ZADD', p .. 'done', now, id)
end
-- A lapsed lease with no attempt left, or marked for cancelling, is lost.
local function sweep(now, max)
  local lapsed = redis.call('ZRANGEBYSCORE', p .. 'leased', '-inf', '(' .. now)
  for _, id in ipairs(lapsed) do
    local k = jk(id)
    local f = redis.call('HMGET', k, 'attempt', 'cancel', 'seq')
    if num(f[1]) >= max or f[2] == '1' then
      redis.call('HSET', k, 'state', 'lost')
      redis.call('HDEL', k, 'token', 'leased_until')
      redis.call('ZREM', p .. 'leased', id)
      redis.call('ZADD', p .. 'lost', num(f[3]), id)
    end
  end
end
local function held(id, token)
  local f = redis.call('HMGET', jk(id), 'state', 'token')
  return f[1] == 'leased' and f[2] == token
end
";

/// ARGV: prefix, id, payload, now, needs, group, supersede.
const ENQUEUE: &str = "return enqueue(ARGV[2], ARGV[3], num(ARGV[4]), ARGV[5], ARGV[6], ARGV[7])";

/// ARGV: prefix, now, worker, until, max attempts, token, lease ms, the worker's labels (JSON).
const LEASE: &str = r"
local now, worker, untl, max, token = num(ARGV[2]), ARGV[3], num(ARGV[4]), num(ARGV[5]), ARGV[6]
local have = {}
for _, l in ipairs(cjson.decode(ARGV[8])) do have[l] = true end
local function fits(needs)
  if not needs then return true end
  for _, n in ipairs(cjson.decode(needs)) do
    if not have[n] then return false end
  end
  return true
end
local function first_of_group(id, group)
  if not group then return true end
  return redis.call('ZRANGE', p .. 'group:' .. group, 0, 0)[1] == id
end
local function taken(id)
  local f = redis.call('HMGET', jk(id), 'payload', 'attempt', 'queued_at', 'leased_until')
  return {id, f[1], num(f[2]), token, num(f[3]), num(f[4])}
end
local prior = redis.call('GET', p .. 'lease:' .. token)
if prior and held(prior, token) then return taken(prior) end
sweep(now, max)
local ids = redis.call('ZRANGE', p .. 'open', 0, -1)
for _, id in ipairs(ids) do
  local k = jk(id)
  local f = redis.call('HMGET', k, 'state', 'available_at', 'leased_until', 'attempt', 'cancel',
    'needs', 'group')
  if ((f[1] == 'queued' and num(f[2]) <= now)
    or (f[1] == 'leased' and num(f[3]) < now and num(f[4]) < max and f[5] == '0'))
    and fits(f[6]) and first_of_group(id, f[7]) then
    redis.call('HSET', k, 'state', 'leased', 'attempt', num(f[4]) + 1, 'worker', worker,
      'leased_at', now, 'token', token, 'leased_until', untl)
    redis.call('ZADD', p .. 'leased', untl, id)
    redis.call('SET', p .. 'lease:' .. token, id, 'PX', ARGV[7])
    return taken(id)
  end
end
return false
";

/// ARGV: prefix, id, token, until.
const RENEW: &str = r"
if not held(ARGV[2], ARGV[3]) then return 0 end
redis.call('HSET', jk(ARGV[2]), 'leased_until', ARGV[4])
redis.call('ZADD', p .. 'leased', ARGV[4], ARGV[2])
return 1
";

/// ARGV: prefix, id, token, now.
const FINISH: &str = r"
if not held(ARGV[2], ARGV[3]) then return 0 end
done(ARGV[2], 'finished', num(ARGV[4]))
return 1
";

/// ARGV: prefix, id, token, now, max attempts, first backoff ms, backoff cap ms.
const RETRY: &str = r"
local id, now, max = ARGV[2], num(ARGV[4]), num(ARGV[5])
if not held(id, ARGV[3]) then return {'notheld'} end
local k = jk(id)
local attempt = num(redis.call('HGET', k, 'attempt'))
if attempt < max then
  local wait = math.min(num(ARGV[6]) * 2 ^ math.max(attempt - 1, 0), num(ARGV[7]))
  local at = now + wait
  redis.call('HSET', k, 'state', 'queued', 'available_at', at)
  redis.call('HDEL', k, 'worker', 'token', 'leased_until')
  redis.call('ZREM', p .. 'leased', id)
  return {'requeued', at}
end
done(id, 'exhausted', now)
return {'exhausted'}
";

/// ARGV: prefix, now, max attempts.
const TAKE_LOST: &str = r"
local now = num(ARGV[2])
sweep(now, num(ARGV[3]))
local out = {}
for _, id in ipairs(redis.call('ZRANGE', p .. 'lost', 0, -1)) do
  local f = redis.call('HMGET', jk(id), 'payload', 'attempt', 'cancel')
  table.insert(out, {id, f[1], num(f[2]), f[3] == '1' and 1 or 0})
  done(id, f[3] == '1' and 'cancelled' or 'lost', now)
end
return out
";

/// ARGV: prefix, recent. Every open job with its fields, the count of done jobs, and the most
/// recently done (by finished_at, then seq, newest first).
const STATUS: &str = r"
local open = {}
for _, id in ipairs(redis.call('ZRANGE', p .. 'open', 0, -1)) do
  local f = redis.call('HMGET', jk(id), 'state', 'attempt', 'queued_at', 'available_at', 'worker',
    'leased_until', 'payload', 'cancel', 'leased_at', 'needs', 'group')
  table.insert(open, {id, f[1] or '', num(f[2]), num(f[3]), num(f[4]), f[5] or '', num(f[6]),
    f[7] or '', f[8] == '1' and 1 or 0, num(f[9]), f[10] or '', f[11] or ''})
end
local count = redis.call('ZCARD', p .. 'done')
local want = num(ARGV[2])
local recent = {}
if want > 0 and count > 0 then
  local top = redis.call('ZREVRANGE', p .. 'done', 0, want - 1, 'WITHSCORES')
  local seen, cands = {}, {}
  for i = 1, #top, 2 do seen[top[i]] = true; table.insert(cands, top[i]) end
  local last = top[#top]
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', p .. 'done', last, last)) do
    if not seen[id] then table.insert(cands, id) end
  end
  local rows = {}
  for _, id in ipairs(cands) do
    local f = redis.call('HMGET', jk(id), 'attempt', 'finished_at', 'outcome', 'seq')
    table.insert(rows, {id, num(f[1]), num(f[2]), f[3] or '', num(f[4])})
  end
  table.sort(rows, function(a, b)
    if a[3] ~= b[3] then return a[3] > b[3] end
    return a[5] > b[5]
  end)
  for i = 1, math.min(want, #rows) do
    local r = rows[i]
    table.insert(recent, {r[1], r[2], r[3], r[4]})
  end
end
return {open, count, recent}
";

/// ARGV: prefix, key, now, then id, payload, needs, group and supersede of each job.
const ENQUEUE_DELIVERY: &str = r"
local now = num(ARGV[3])
if redis.call('ZADD', p .. 'deliveries', 'NX', now, ARGV[2]) == 0 then return 0 end
for i = 4, #ARGV, 5 do
  enqueue(ARGV[i], ARGV[i + 1], now, ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
end
return 1
";

/// ARGV: prefix, id, card, now, forget before.
const ANNOUNCE: &str = r"
redis.call('HSET', p .. 'workers', ARGV[2], ARGV[3])
redis.call('ZADD', p .. 'workers-seen', ARGV[4], ARGV[2])
for _, id in ipairs(redis.call('ZRANGEBYSCORE', p .. 'workers-seen', '-inf', '(' .. ARGV[5])) do
  redis.call('HDEL', p .. 'workers', id)
  redis.call('ZREM', p .. 'workers-seen', id)
end
return 1
";

/// ARGV: prefix. Each worker's card and when it was last seen.
const WORKERS: &str = r"
local out = {}
for _, id in ipairs(redis.call('ZRANGE', p .. 'workers-seen', 0, -1)) do
  local card = redis.call('HGET', p .. 'workers', id)
  if card then
    table.insert(out, {card, num(redis.call('ZSCORE', p .. 'workers-seen', id))})
  end
end
return out
";

/// How long a live view is kept in Redis after it was last written, whatever prunes it.
const LIVE_TTL_SECS: u64 = 7 * 24 * 3600;

/// ARGV: prefix, job id, snapshot, now, ttl seconds, then the lines.
const LIVE_PUT: &str = r"
local id, now = ARGV[2], num(ARGV[4])
local k, lk = p .. 'live:' .. id, p .. 'live-lines:' .. id
for i = 6, #ARGV do redis.call('RPUSH', lk, ARGV[i]) end
redis.call('HSET', k, 'snapshot', ARGV[3], 'updated', now)
redis.call('ZADD', p .. 'live', now, id)
redis.call('EXPIRE', k, ARGV[5])
if redis.call('EXISTS', lk) == 1 then redis.call('EXPIRE', lk, ARGV[5]) end
return 1
";

/// ARGV: prefix, job id, from, max.
const LIVE_GET: &str = r"
local id, from, max = ARGV[2], num(ARGV[3]), num(ARGV[4])
local k, lk = p .. 'live:' .. id, p .. 'live-lines:' .. id
local f = redis.call('HMGET', k, 'snapshot', 'updated')
if not f[1] then return false end
local lines = {}
if max > 0 then lines = redis.call('LRANGE', lk, from, from + max - 1) end
return {f[1], num(f[2]), redis.call('LLEN', lk), lines}
";

/// ARGV: prefix, before.
const LIVE_PRUNE: &str = r"
local ids = redis.call('ZRANGEBYSCORE', p .. 'live', '-inf', '(' .. ARGV[2])
for _, id in ipairs(ids) do
  redis.call('DEL', p .. 'live:' .. id, p .. 'live-lines:' .. id)
end
redis.call('ZREMRANGEBYSCORE', p .. 'live', '-inf', '(' .. ARGV[2])
return #ids
";

/// ARGV: prefix, id.
const LEAVE: &str = r"
redis.call('HDEL', p .. 'workers', ARGV[2])
redis.call('ZREM', p .. 'workers-seen', ARGV[2])
return 1
";

/// ARGV: prefix, server, pin, first ('1': only when the server has none). The drift noted for
/// the server goes with a pin stored.
const PUT_PIN: &str = r"
local stored = 1
if ARGV[4] == '1' then
  stored = redis.call('HSETNX', p .. 'pins', ARGV[2], ARGV[3])
else
  redis.call('HSET', p .. 'pins', ARGV[2], ARGV[3])
end
if stored == 1 then redis.call('HDEL', p .. 'pin-drift', ARGV[2]) end
return stored
";

/// ARGV: prefix, before.
const PRUNE: &str = r"
local before = '(' .. ARGV[2]
local ids = redis.call('ZRANGEBYSCORE', p .. 'done', '-inf', before)
for _, id in ipairs(ids) do redis.call('DEL', jk(id)) end
redis.call('ZREMRANGEBYSCORE', p .. 'done', '-inf', before)
redis.call('ZREMRANGEBYSCORE', p .. 'deliveries', '-inf', before)
return #ids
";

/// ARGV: prefix, id, now.
const CANCEL: &str = r"
local id, now = ARGV[2], num(ARGV[3])
local k = jk(id)
if redis.call('EXISTS', k) == 0 then return {'unknown'} end
local f = redis.call('HMGET', k, 'state', 'payload', 'attempt', 'leased_until', 'worker')
if f[1] == 'done' then return {'done'} end
if f[1] == 'leased' and num(f[4]) >= now then
  redis.call('HSET', k, 'cancel', 1)
  return {'stopping', f[5] or ''}
end
done(id, 'cancelled', now)
redis.call('HSET', k, 'cancel', 1)
return {'removed', f[2] or '', num(f[3])}
";

/// ARGV: prefix, id, token.
const LEASE_STATE: &str = r"
local f = redis.call('HMGET', jk(ARGV[2]), 'state', 'token', 'cancel')
if f[1] ~= 'leased' or f[2] ~= ARGV[3] then return 'lost' end
if f[3] == '1' then return 'cancel' end
return 'held'
";

/// ARGV: prefix, id, token, now.
const RELEASE: &str = r"
local id = ARGV[2]
if not held(id, ARGV[3]) then return 0 end
local k = jk(id)
local attempt = num(redis.call('HGET', k, 'attempt'))
redis.call('HSET', k, 'state', 'queued', 'available_at', ARGV[4], 'attempt', math.max(attempt - 1, 0))
redis.call('HDEL', k, 'worker', 'token', 'leased_until')
redis.call('ZREM', p .. 'leased', id)
return 1
";

struct Scripts {
    enqueue: Script,
    lease: Script,
    renew: Script,
    finish: Script,
    retry: Script,
    take_lost: Script,
    status: Script,
    enqueue_delivery: Script,
    prune: Script,
    cancel: Script,
    lease_state: Script,
    release: Script,
    announce: Script,
    workers: Script,
    leave: Script,
    live_put: Script,
    live_get: Script,
    live_prune: Script,
    put_pin: Script,
}

impl Scripts {
    fn new() -> Scripts {
        let s = |body: &str| Script::new(&format!("{PRELUDE}\n{body}"));
        Scripts {
            enqueue: s(ENQUEUE),
            lease: s(LEASE),
            renew: s(RENEW),
            finish: s(FINISH),
            retry: s(RETRY),
            take_lost: s(TAKE_LOST),
            status: s(STATUS),
            enqueue_delivery: s(ENQUEUE_DELIVERY),
            prune: s(PRUNE),
            cancel: s(CANCEL),
            lease_state: s(LEASE_STATE),
            release: s(RELEASE),
            announce: s(ANNOUNCE),
            workers: s(WORKERS),
            leave: s(LEAVE),
            live_put: s(LIVE_PUT),
            live_get: s(LIVE_GET),
            live_prune: s(LIVE_PRUNE),
            put_pin: s(PUT_PIN),
        }
    }
}

/// Where the queue's Redis is, and how to sign in: `PI_QUEUE` (a `redis://`, `rediss://` or
/// `redis+unix://` URL without a password) and the password, when one is set, from the worker's
/// environment (`PI_QUEUE_PASSWORD`), never from the URL.
#[derive(Clone)]
pub struct RedisTarget {
    pub url: String,
    pub password: Option<String>,
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTarget")
            .field("url", &self.url)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// The queue in Redis. One connection a handle, opened again when it breaks.
pub struct RedisQueue {
    client: redis::Client,
    conn: Mutex<Option<Connection>>,
    config: Config,
    scripts: Scripts,
    outage_limit: Duration,
    /// Where Redis is (host and port, or its socket), for logs and errors: never a password.
    address: String,
}

impl std::fmt::Debug for RedisQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisQueue")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Whether a failure may pass: the connection broke or was refused, or Redis is still loading its
/// data after a restart. A refused password, a missing permission or a bad address does not: it
/// fails at once.
fn may_pass(e: &RedisError) -> bool {
    // A TLS handshake that fails (a certificate nobody vouches for) is an I/O error too, of data
    // that will not change by waiting.
    if io_kind(e).is_some_and(|k| {
        matches!(
            k.as_str(),
            "InvalidData" | "InvalidInput" | "PermissionDenied" | "Unsupported"
        )
    }) {
        return false;
    }
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(
                redis::ServerErrorKind::BusyLoading
                    | redis::ServerErrorKind::TryAgain
                    | redis::ServerErrorKind::MasterDown
            )
        )
}

impl RedisQueue {
    /// Opens the queue at `target` with the default [`Config`]; see [`RedisQueue::open_with`].
    pub fn open(target: &RedisTarget) -> Result<RedisQueue, QueueError> {
        RedisQueue::open_with(target, Config::default(), DEFAULT_OUTAGE_LIMIT)
    }

    /// Opens the queue and checks that Redis answers (waiting up to `outage_limit` for it).
    pub fn open_with(
        target: &RedisTarget,
        config: Config,
        outage_limit: Duration,
    ) -> Result<RedisQueue, QueueError> {
        use redis::IntoConnectionInfo as _;
        let bad = |e: RedisError| QueueError::Redis {
            op: "read the queue's address",
            detail: e.category().to_owned(),
        };
        let mut info = target.url.as_str().into_connection_info().map_err(bad)?;
        if let Some(password) = &target.password {
            let settings = info.redis_settings().clone().set_password(password);
            info = info.set_redis_settings(settings);
        }
        let address = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port)
            | redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
            redis::ConnectionAddr::Unix(path) => path.display().to_string(),
            _ => "an address of another kind".to_owned(),
        };
        let client = redis::Client::open(info).map_err(bad)?;
        let mut queue = RedisQueue {
            client,
            conn: Mutex::new(None),
            config: Config {
                max_attempts: config.max_attempts.max(1),
                ..config
            },
            scripts: Scripts::new(),
            outage_limit: outage_limit.min(FIRST_CONTACT_LIMIT),
            address,
        };
        queue.call("reach Redis", |c| redis::cmd("PING").query::<String>(c))?;
        queue.outage_limit = outage_limit;
        Ok(queue)
    }

    fn connect(&self) -> Result<Connection, RedisError> {
        let conn = self.client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
        conn.set_read_timeout(Some(IO_TIMEOUT))?;
        conn.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(conn)
    }

    fn guard(&self) -> MutexGuard<'_, Option<Connection>> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the connection, opening it (again) as needed and trying again while Redis is
    /// away, for up to the outage limit.
    pub(crate) fn call<T>(
        &self,
        op: &'static str,
        mut f: impl FnMut(&mut Connection) -> Result<T, RedisError>,
    ) -> Result<T, QueueError> {
        let deadline = Instant::now() + self.outage_limit;
        let mut pause = Duration::from_millis(20);
        let mut said = false;
        loop {
            let result = {
                let mut guard = self.guard();
                let conn = match guard.as_mut() {
                    Some(c) => Ok(c),
                    None => self.connect().map(|c| guard.insert(c)),
                };
                let result = conn.and_then(&mut f);
                if result.as_ref().is_err_and(may_pass) {
                    *guard = None;
                }
                result
            };
            match result {
                Ok(v) => {
                    if said {
                        tracing::info!(event = "queue_reconnected", op);
                    }
                    return Ok(v);
                }
                Err(e) if may_pass(&e) && Instant::now() < deadline => {
                    if !said {
                        tracing::warn!(event = "queue_unreachable", op, address = %self.address,
                            why = e.category());
                        said = true;
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    return Err(QueueError::Redis {
                        op,
                        detail: format!("{} at {}", describe(&e), self.address),
                    });
                }
            }
        }
    }

    /// Runs `script` with the prefix and `args`.
    pub(crate) fn run<T: redis::FromRedisValue>(
        &self,
        op: &'static str,
        script: &Script,
        args: &[String],
    ) -> Result<T, QueueError> {
        self.call(op, |c| {
            let mut invocation = script.prepare_invoke();
            invocation.arg(PREFIX);
            for a in args {
                invocation.arg(a);
            }
            invocation.invoke(c)
        })
    }

    /// Every field of hash `key` (under the prefix) with its value, by field.
    fn sorted_hash(
        &self,
        op: &'static str,
        key: &str,
    ) -> Result<Vec<(String, String)>, QueueError> {
        let all: std::collections::BTreeMap<String, String> = self.call(op, |c| {
            redis::cmd("HGETALL").arg(format!("{PREFIX}{key}")).query(c)
        })?;
        Ok(all.into_iter().collect())
    }

    /// The server's `INFO` sections `server` and `persistence`, for doctor.
    pub fn info(&self) -> Result<String, QueueError> {
        self.call("read Redis's INFO", |c| {
            redis::cmd("INFO").arg("server").arg("persistence").query(c)
        })
    }
}

/// The kind of the I/O error under a failure, if it is one. The redis crate keeps the error itself
/// to itself; its `Debug` form names the kind (`kind: InvalidData`).
fn io_kind(e: &RedisError) -> Option<String> {
    if !e.is_io_error() {
        return None;
    }
    let shown = format!("{:?}", std::error::Error::source(e)?);
    let rest = &shown[shown.find("kind: ")? + "kind: ".len()..];
    Some(
        rest.chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect(),
    )
}

/// What a failure was, by its kind and the server's code: never a value of a key.
fn describe(e: &RedisError) -> String {
    match (e.code(), io_kind(e).as_deref()) {
        (Some(code), _) => format!("{} ({code})", e.category()),
        (None, Some("InvalidData")) => format!(
            "{} (the connection's data was refused: for rediss://, is the server's certificate trusted?)",
            e.category()
        ),
        (None, Some(kind)) => format!("{} ({kind})", e.category()),
        (None, None) => e.category().to_owned(),
    }
}

/// A job's placement as the scripts take it: needs (a JSON array, or empty for any worker), group
/// (empty for none), and whether it supersedes ('1' or '0').
fn placement_args(placement: &Placement) -> [String; 3] {
    [
        stored::needs_json(&placement.needs).unwrap_or_default(),
        placement.group.clone().unwrap_or_default(),
        if placement.supersede { "1" } else { "0" }.to_owned(),
    ]
}

/// A lease's token: 16 random bytes as hex.
fn new_token(op: &'static str) -> Result<String, QueueError> {
    protocol::ids::random_hex::<16>().map_err(|e| QueueError::Redis {
        op,
        detail: e.to_string(),
    })
}

/// Reads a script's answer: what the scripts return is a fixed shape, so one that is not is a
/// queue error, never a panic.
fn shape<T>(op: &'static str, v: Option<T>) -> Result<T, QueueError> {
    v.ok_or_else(|| QueueError::Redis {
        op,
        detail: "an answer of the wrong shape".to_owned(),
    })
}

fn items(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(a) => Some(a),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

fn u32_of(v: &Value) -> Option<u32> {
    int(v).and_then(|n| u32::try_from(n).ok())
}

impl Queue for RedisQueue {
    fn enqueue_job(&self, job: &NewJob, now: SystemTime) -> Result<bool, QueueError> {
        let mut args = vec![
            job.id.clone(),
            job.payload.clone(),
            millis::of(now).to_string(),
        ];
        args.extend(placement_args(&job.placement));
        let added: i64 = self.run("enqueue a job", &self.scripts.enqueue, &args)?;
        Ok(added == 1)
    }

    fn lease_as(
        &self,
        worker: &str,
        labels: &[String],
        lease_for: Duration,
        now: SystemTime,
    ) -> Result<Option<Lease>, QueueError> {
        const OP: &str = "lease a job";
        // One token for every try of this call: a try whose answer was lost is found again.
        let token = new_token(OP)?;
        let until = millis::later(millis::of(now), lease_for);
        let lease_ms = i64::try_from(lease_for.as_millis())
            .unwrap_or(i64::MAX)
            .max(1);
        let answer: Value = self.run(
            OP,
            &self.scripts.lease,
            &[
                millis::of(now).to_string(),
                worker.to_owned(),
                until.to_string(),
                self.config.max_attempts.to_string(),
                token.clone(),
                lease_ms.to_string(),
                stored::labels_json(labels),
            ],
        )?;
        if matches!(answer, Value::Nil) {
            return Ok(None);
        }
        let row = shape(OP, items(&answer))?;
        let lease = (|| {
            Some(Lease {
                job_id: text(row.first()?)?,
                payload: text(row.get(1)?).unwrap_or_default(),
                attempt: u32_of(row.get(2)?)?,
                token: text(row.get(3)?)?,
                queued_at: millis::time(int(row.get(4)?)?),
                until: millis::time(int(row.get(5)?)?),
            })
        })();
        shape(OP, lease).map(Some)
    }

    fn renew(
        &self,
        lease: &Lease,
        lease_for: Duration,
        now: SystemTime,
    ) -> Result<bool, QueueError> {
        let renewed: i64 = self.run(
            "renew a lease",
            &self.scripts.renew,
            &[
                lease.job_id.clone(),
                lease.token.clone(),
                millis::later(millis::of(now), lease_for).to_string(),
            ],
        )?;
        Ok(renewed == 1)
    }

    fn finish(&self, lease: &Lease, now: SystemTime) -> Result<bool, QueueError> {
        let finished: i64 = self.run(
            "finish a job",
            &self.scripts.finish,
            &[
                lease.job_id.clone(),
                lease.token.clone(),
                millis::of(now).to_string(),
            ],
        )?;
        Ok(finished == 1)
    }

    fn retry(&self, lease: &Lease, now: SystemTime) -> Result<RetryDecision, QueueError> {
        const OP: &str = "retry a job";
        let backoff = self.config.backoff;
        let answer: Value = self.run(
            OP,
            &self.scripts.retry,
            &[
                lease.job_id.clone(),
                lease.token.clone(),
                millis::of(now).to_string(),
                self.config.max_attempts.to_string(),
                backoff.first.as_millis().to_string(),
                backoff.cap.as_millis().to_string(),
            ],
        )?;
        let row = shape(OP, items(&answer))?;
        match shape(OP, row.first().and_then(text))?.as_str() {
            "notheld" => Ok(RetryDecision::NotHeld),
            "exhausted" => Ok(RetryDecision::Exhausted),
            _ => Ok(RetryDecision::Requeued {
                available_at: millis::time(shape(OP, row.get(1).and_then(int))?),
            }),
        }
    }

    fn take_lost(&self, now: SystemTime) -> Result<Vec<LostJob>, QueueError> {
        const OP: &str = "take the lost jobs";
        let answer: Value = self.run(
            OP,
            &self.scripts.take_lost,
            &[
                millis::of(now).to_string(),
                self.config.max_attempts.to_string(),
            ],
        )?;
        shape(OP, items(&answer))?
            .iter()
            .map(|row| {
                let row = items(row)?;
                Some(LostJob {
                    job_id: text(row.first()?)?,
                    payload: text(row.get(1)?).unwrap_or_default(),
                    attempt: u32_of(row.get(2)?)?,
                    cancelled: int(row.get(3)?)? == 1,
                })
            })
            .map(|l| shape(OP, l))
            .collect()
    }

    fn status(&self, now: SystemTime, recent_done: usize) -> Result<Status, QueueError> {
        const OP: &str = "read the queue's status";
        let now = millis::of(now);
        // Lua's numbers are doubles: a count past 2^32 is all of them anyway.
        let recent = recent_done.min(u32::MAX as usize);
        let answer: Value = self.run(OP, &self.scripts.status, &[recent.to_string()])?;
        let parts = shape(OP, items(&answer))?;
        let open_rows = shape(OP, parts.first().and_then(items))?;
        let mut open = Vec::with_capacity(open_rows.len());
        for row in open_rows {
            let job = (|| {
                let row = items(row)?;
                let state = match Stored::named(&text(row.get(1)?)?) {
                    Some(Stored::Queued) => stored::queued(int(row.get(4)?)?, now),
                    Some(Stored::Leased) => OpenState::Leased {
                        worker: text(row.get(5)?).unwrap_or_default(),
                        until: millis::time(int(row.get(6)?)?),
                        since: millis::time(int(row.get(9)?)?),
                    },
                    _ => OpenState::Lost,
                };
                Some(OpenJob {
                    id: text(row.first()?)?,
                    state,
                    attempt: u32_of(row.get(2)?)?,
                    queued_at: millis::time(int(row.get(3)?)?),
                    payload: text(row.get(7)?).unwrap_or_default(),
                    cancel_requested: int(row.get(8)?)? == 1,
                    needs: stored::needs_of(text(row.get(10)?)),
                    group: text(row.get(11)?).filter(|g| !g.is_empty()),
                })
            })();
            open.push(shape(OP, job)?);
        }
        let done = shape(OP, parts.get(1).and_then(int))?;
        let mut recent = Vec::new();
        for row in shape(OP, parts.get(2).and_then(items))? {
            let job = (|| {
                let row = items(row)?;
                Some(DoneJob {
                    id: text(row.first()?)?,
                    attempt: u32_of(row.get(1)?)?,
                    finished_at: millis::time(int(row.get(2)?)?),
                    end: End::named(&text(row.get(3)?)?)?,
                })
            })();
            recent.push(shape(OP, job)?);
        }
        Ok(Status::new(
            open,
            usize::try_from(done).unwrap_or(0),
            recent,
        ))
    }

    fn enqueue_delivery(
        &self,
        key: &str,
        jobs: &[NewJob],
        now: SystemTime,
    ) -> Result<bool, QueueError> {
        let mut args = vec![key.to_owned(), millis::of(now).to_string()];
        for job in jobs {
            args.push(job.id.clone());
            args.push(job.payload.clone());
            args.extend(placement_args(&job.placement));
        }
        let new: i64 = self.run("remember a delivery", &self.scripts.enqueue_delivery, &args)?;
        Ok(new == 1)
    }

    fn prune_done(&self, before: SystemTime) -> Result<usize, QueueError> {
        let pruned: i64 = self.run(
            "prune done jobs",
            &self.scripts.prune,
            &[millis::of(before).to_string()],
        )?;
        Ok(usize::try_from(pruned).unwrap_or(0))
    }

    fn cancel(&self, id: &str, now: SystemTime) -> Result<Cancel, QueueError> {
        const OP: &str = "cancel a job";
        let answer: Value = self.run(
            OP,
            &self.scripts.cancel,
            &[id.to_owned(), millis::of(now).to_string()],
        )?;
        let row = shape(OP, items(&answer))?;
        Ok(match shape(OP, row.first().and_then(text))?.as_str() {
            "unknown" => Cancel::Unknown,
            "done" => Cancel::AlreadyDone,
            "stopping" => Cancel::Stopping {
                worker: row.get(1).and_then(text).unwrap_or_default(),
            },
            _ => Cancel::Removed {
                payload: row.get(1).and_then(text).unwrap_or_default(),
                attempt: shape(OP, row.get(2).and_then(u32_of))?,
            },
        })
    }

    fn lease_state(&self, lease: &Lease) -> Result<LeaseState, QueueError> {
        let state: String = self.run(
            "read a job's cancel mark",
            &self.scripts.lease_state,
            &[lease.job_id.clone(), lease.token.clone()],
        )?;
        Ok(match state.as_str() {
            "held" => LeaseState::Held,
            "cancel" => LeaseState::CancelRequested,
            _ => LeaseState::Lost,
        })
    }

    fn announce(&self, card: &WorkerCard, now: SystemTime) -> Result<(), QueueError> {
        let text = stored::card_text(card)?;
        let _: i64 = self.run(
            "announce a worker",
            &self.scripts.announce,
            &[
                card.id.clone(),
                text,
                millis::of(now).to_string(),
                millis::forget_before(now).to_string(),
            ],
        )?;
        Ok(())
    }

    fn workers(&self) -> Result<Vec<WorkerSeen>, QueueError> {
        const OP: &str = "list the workers";
        let answer: Value = self.run(OP, &self.scripts.workers, &[])?;
        let mut seen = Vec::new();
        for row in shape(OP, items(&answer))? {
            let row = shape(OP, items(row))?;
            let card = shape(OP, row.first().and_then(text))?;
            let last_seen = shape(OP, row.get(1).and_then(int))?;
            seen.extend(stored::worker_seen(&card, last_seen));
        }
        seen.sort_by(|a, b| a.card.id.cmp(&b.card.id));
        Ok(seen)
    }

    fn leave(&self, id: &str) -> Result<(), QueueError> {
        let _: i64 = self.run("forget a worker", &self.scripts.leave, &[id.to_owned()])?;
        Ok(())
    }

    fn live_put(
        &self,
        job_id: &str,
        snapshot: &str,
        lines: &[String],
        now: SystemTime,
    ) -> Result<(), QueueError> {
        let mut args = vec![
            job_id.to_owned(),
            snapshot.to_owned(),
            millis::of(now).to_string(),
            LIVE_TTL_SECS.to_string(),
        ];
        args.extend(lines.iter().cloned());
        let _: i64 = self.run("store a job's live view", &self.scripts.live_put, &args)?;
        Ok(())
    }

    fn live_get(
        &self,
        job_id: &str,
        from: u64,
        max: usize,
    ) -> Result<Option<LiveView>, QueueError> {
        const OP: &str = "read a job's live view";
        let answer: Value = self.run(
            OP,
            &self.scripts.live_get,
            &[
                job_id.to_owned(),
                from.to_string(),
                max.min(u32::MAX as usize).to_string(),
            ],
        )?;
        if matches!(answer, Value::Nil) {
            return Ok(None);
        }
        let row = shape(OP, items(&answer))?;
        let view = (|| {
            Some(LiveView {
                snapshot: text(row.first()?)?,
                updated: millis::time(int(row.get(1)?)?),
                total: u64::try_from(int(row.get(2)?)?).ok()?,
                lines: items(row.get(3)?)?
                    .iter()
                    .map(text)
                    .collect::<Option<Vec<_>>>()?,
            })
        })();
        shape(OP, view).map(Some)
    }

    fn live_prune(&self, before: SystemTime) -> Result<usize, QueueError> {
        let gone: i64 = self.run(
            "prune live views",
            &self.scripts.live_prune,
            &[millis::of(before).to_string()],
        )?;
        Ok(usize::try_from(gone).unwrap_or(0))
    }

    fn link_rerun(&self, original: &str, rerun: &str) -> Result<(), QueueError> {
        let key = format!("{PREFIX}reruns:{original}");
        self.call("link a rerun", |c| {
            redis::cmd("RPUSH").arg(&key).arg(rerun).query::<i64>(c)
        })?;
        Ok(())
    }

    fn reruns(&self, original: &str) -> Result<Vec<String>, QueueError> {
        let key = format!("{PREFIX}reruns:{original}");
        self.call("read the reruns of a job", |c| {
            redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).query(c)
        })
    }

    fn pin(&self, server: &str) -> Result<Option<String>, QueueError> {
        self.call("read a server's pin", |c| {
            redis::cmd("HGET")
                .arg(format!("{PREFIX}pins"))
                .arg(server)
                .query(c)
        })
    }

    fn pins(&self) -> Result<Vec<(String, String)>, QueueError> {
        self.sorted_hash("read the pins", "pins")
    }

    fn put_pin(
        &self,
        server: &str,
        pin: &str,
        first: bool,
        _now: SystemTime,
    ) -> Result<bool, QueueError> {
        let args = [
            server.to_owned(),
            pin.to_owned(),
            u8::from(first).to_string(),
        ];
        let stored: i64 = self.run("store a server's pin", &self.scripts.put_pin, &args)?;
        Ok(stored == 1)
    }

    fn put_pin_drift(&self, server: &str, drift: &str, _now: SystemTime) -> Result<(), QueueError> {
        self.call("note a server's drift from its pin", |c| {
            redis::cmd("HSET")
                .arg(format!("{PREFIX}pin-drift"))
                .arg(server)
                .arg(drift)
                .query::<i64>(c)
        })?;
        Ok(())
    }

    fn pin_drifts(&self) -> Result<Vec<(String, String)>, QueueError> {
        self.sorted_hash("read the drift from pins", "pin-drift")
    }

    fn release(&self, lease: &Lease, now: SystemTime) -> Result<bool, QueueError> {
        let released: i64 = self.run(
            "hand a job back",
            &self.scripts.release,
            &[
                lease.job_id.clone(),
                lease.token.clone(),
                millis::of(now).to_string(),
            ],
        )?;
        Ok(released == 1)
    }
}
