-- shard_heads.lua: first step of an admission tick for one shard.
-- Ends lapsed active sessions, removes abandoned places at the front, and reports the shard's
-- sizes, its first `k` waiting, and (for global_counter) the figures its positions need.
--
-- KEYS[1]  waiting zset of the shard
-- KEYS[2]  active zset of the shard
-- KEYS[3]  last-seen zset of the shard
-- KEYS[4]  the shard's horizon cursor (string): the score of the last person stamped
-- ARGV[1]  expiry bound, ms: sessions admitted at or before it have run out (now - ttl)
-- ARGV[2]  k, how many heads to return (0 = none)
-- ARGV[3]  abandon bound, ms: people last seen at or before it have left without saying so
-- ARGV[4]  start of the global_counter range of scores ('' = none)
-- ARGV[5]  the abandon bound for people who have polled while the overload guard holds (older
--          than ARGV[3]: the guard gives the benefit of the doubt for a while, not forever)
-- ARGV[6]  the shard's horizon: how many from the front keep a last-seen record
-- ARGV[7]  now, ms
-- Returns  {active_count, waiting_count, {member1, score1, ...}, abandoned_removed,
--           waiting_before_counter_range, first_score_in_counter_range or '',
--           1 when the overload guard suspended abandonment, else 0}
--
-- Abandoned people are removed only while they stand among the first k: the scan stays
-- bounded (at most 4 passes), and people further back are checked when they reach the front.
--
-- Overload guard: when fewer than half of those in the shard who have polled were seen after the
-- abandon bound, the likelier cause is that their polls did not reach the service (overloaded,
-- or cut off), not that most of them left: while it lasts, people who have polled are removed as
-- abandoned only past the longer bound ARGV[5], and so are people stamped inside the horizon
-- (below). Entries recorded at their enter that never polled (-now, see enter.lua) neither count
-- towards the guard nor are covered by it; no negative record counts towards it, so a crowd of
-- entries that never poll cannot switch abandonment off.
-- Lines under GUARD_MIN polled people per shard are too small to tell.
--
-- The horizon: only the first ARGV[6] of the line keep a last-seen record (enter.lua and polls
-- write none further back), so the last-seen set does not grow with the line. As the line moves,
-- people come inside; each tick stamps those who came in since the last (the ranks from the cursor
-- to the horizon, at most STAMP per tick) with `ZADD NX -(now + 0.5)`: "inside since now, not
-- polled since", which their next poll turns into a positive record. The half tells a stamp from
-- an entry that never polled (-now, whole): a stamped person may have polled further back, so
-- while the guard holds they keep the guard's longer bound like people who polled; otherwise the
-- normal bound. Stamps are negative, so a crowd that never polls cannot count towards the guard.
-- Members with the cursor's own score that were not stamped, or anyone the cursor skipped, keep
-- no record and are never taken for gone: the safe side.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
local k = tonumber(ARGV[2])
local heads = {}
local abandoned = 0
-- Variadic commands over chunks of members: one redis.call costs microseconds whatever it
-- carries, so a call per person would dominate the tick (measured: docs/benchmarks.md).
local CHUNK = 1000
local GUARD_MIN = 100
local waiting = redis.call('ZCARD', KEYS[1])
local suspended = 0
local polled = redis.call('ZCOUNT', KEYS[3], '(0', '+inf')
if polled >= GUARD_MIN and 2 * redis.call('ZCOUNT', KEYS[3], '(' .. ARGV[3], '+inf') < polled then
  suspended = 1
end
local cut_entered = tonumber(ARGV[3])
local cut_polled = cut_entered
if suspended == 1 then
  cut_polled = tonumber(ARGV[5])
end
if k > 0 then
  heads = redis.call('ZRANGE', KEYS[1], 0, k - 1, 'WITHSCORES')
  for _ = 1, 4 do
    local gone = {}
    for c = 1, #heads, 2 * CHUNK do
      local chunk = {}
      for i = c, math.min(c + 2 * CHUNK - 1, #heads), 2 do
        chunk[#chunk + 1] = heads[i]
      end
      local seen = redis.call('ZMSCORE', KEYS[3], unpack(chunk))
      for i, member in ipairs(chunk) do
        local s = seen[i] and tonumber(seen[i])
        -- is_gone(): lua/line_lib.lua, prepended when the script is loaded.
        if s and is_gone(s, cut_polled, cut_entered) then
          gone[#gone + 1] = member
        end
      end
    end
    if #gone == 0 then
      break
    end
    for c = 1, #gone, CHUNK do
      local last = math.min(c + CHUNK - 1, #gone)
      redis.call('ZREM', KEYS[1], unpack(gone, c, last))
      redis.call('ZREM', KEYS[3], unpack(gone, c, last))
    end
    abandoned = abandoned + #gone
    heads = redis.call('ZRANGE', KEYS[1], 0, k - 1, 'WITHSCORES')
  end
end
local carried, first = 0, ''
if ARGV[4] ~= '' then
  carried = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. ARGV[4])
  local f = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[4], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #f > 0 then
    first = f[2]
  end
end
local horizon = tonumber(ARGV[6])
local STAMP = 1000
local cursor = redis.call('GET', KEYS[4])
local from = 0
if cursor then
  from = redis.call('ZCOUNT', KEYS[1], '-inf', cursor)
end
if from > horizon then
  -- The horizon shrank (a lower rate) or people arrived ahead of the cursor: restart at its edge.
  local edge = redis.call('ZRANGE', KEYS[1], horizon - 1, horizon - 1, 'WITHSCORES')
  if #edge > 0 then
    redis.call('SET', KEYS[4], edge[2])
  end
elseif from < horizon then
  local fresh = redis.call('ZRANGE', KEYS[1], from, math.min(horizon, from + STAMP) - 1,
                           'WITHSCORES')
  if #fresh > 0 then
    local stamp = -(tonumber(ARGV[7]) + 0.5)
    local add = {}
    for i = 1, #fresh, 2 do
      add[#add + 1] = stamp
      add[#add + 1] = fresh[i]
    end
    redis.call('ZADD', KEYS[3], 'NX', unpack(add))
    redis.call('SET', KEYS[4], fresh[#fresh])
  end
end
-- Every place removed above was read from the line in this script: the line is now
-- `waiting - abandoned` long.
return {redis.call('ZCARD', KEYS[2]), waiting - abandoned, heads, abandoned, carried, first,
        suspended}
