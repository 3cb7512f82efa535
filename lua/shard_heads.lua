-- shard_heads.lua: first step of an admission tick for one shard.
-- Ends lapsed active sessions, removes abandoned places at the front, and reports the shard's
-- sizes, its first `k` waiting, and (for global_counter) the figures its positions need.
--
-- KEYS[1]  waiting zset of the shard
-- KEYS[2]  active zset of the shard
-- KEYS[3]  last-seen zset of the shard
-- KEYS[4]  the shard's crossings (zset, see lua/line_lib.lua)
-- ARGV[1]  expiry bound, ms: sessions admitted at or before it have run out (now - ttl)
-- ARGV[2]  k, how many heads to return (0 = none)
-- ARGV[3]  abandon bound, ms: people last seen at or before it have left without saying so
-- ARGV[4]  start of the global_counter range of scores ('' = none)
-- ARGV[5]  the abandon bound for people who have polled while the overload guard holds (older
--          than ARGV[3]: the guard gives the benefit of the doubt for a while, not forever)
-- ARGV[6]  the shard's horizon: how many from the front keep a last-seen record
-- ARGV[7]  now, ms (the time of this tick's crossing)
-- Returns  {active_count, waiting_count, {member1, score1, ...}, abandoned_removed,
--           waiting_before_counter_range, first_score_in_counter_range or '',
--           1 when the overload guard suspended abandonment, else 0,
--           {numbers in the counter range removed as abandoned}}
--
-- The numbers removed go to the leader's publication (lua/publish_counter.lua), which records
-- those still ahead of somebody as gaps: a place removed here need not be the global head (it is
-- among the first k of its shard), and counted positions behind it must not count it.
--
-- Abandoned people are removed only while they stand among the first k: the scan stays
-- bounded (at most 4 passes), and people further back are checked when they reach the front.
--
-- Overload guard: when fewer than half of those in the shard who have polled were seen after the
-- abandon bound, the likelier cause is that their polls did not reach the service (overloaded,
-- or cut off), not that most of them left: while it lasts, people who have polled are removed as
-- abandoned only past the longer bound ARGV[5], and so are people who came inside the horizon
-- without a record since (below). Entries recorded at their enter that never polled (-now, see
-- enter.lua) neither count towards the guard nor are covered by it; only positive records count
-- towards it, so a crowd of entries that never poll cannot switch abandonment off.
-- Lines under GUARD_MIN polled people per shard are too small to tell.
--
-- The horizon: only the first ARGV[6] of the line keep a last-seen record (enter.lua and polls
-- write none further back), so the last-seen set does not grow with the line. As the line moves,
-- people come inside: each tick that moves the horizon adds one crossing (lua/line_lib.lua), the
-- score of the last person now inside with the tick's time, so coming inside costs one entry per
-- tick, not one per person. Someone inside without a record counts as seen when they came inside:
-- their first poll there writes a record (lua/seen.lua), and if none comes they are taken for gone
-- at the polled bound. Crossings before the front of the line are dropped.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
local k = tonumber(ARGV[2])
local heads = {}
local abandoned = 0
local counted_from = tonumber(ARGV[4])
local numbers_gone = {}
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
      local chunk, scores = {}, {}
      for i = c, math.min(c + 2 * CHUNK - 1, #heads), 2 do
        chunk[#chunk + 1] = heads[i]
        scores[#scores + 1] = heads[i + 1]
      end
      -- abandoned_flags(): lua/line_lib.lua, prepended when the script is loaded.
      local flags = abandoned_flags(KEYS[3], KEYS[4], chunk, scores, cut_polled, cut_entered)
      for i, member in ipairs(chunk) do
        if flags[i] then
          gone[#gone + 1] = member
          if counted_from and tonumber(scores[i]) >= counted_from then
            numbers_gone[#numbers_gone + 1] = scores[i]
          end
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
-- The horizon moves: one crossing at the score of the last person now inside (the
-- horizon's edge, or the line's last when it is shorter), when that is beyond the newest one.
local horizon = tonumber(ARGV[6])
local newest = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
local inside = 0
if #newest > 0 then
  inside = redis.call('ZCOUNT', KEYS[1], '-inf', newest[2])
end
if inside < horizon then
  local edge = redis.call('ZRANGE', KEYS[1], horizon - 1, horizon - 1, 'WITHSCORES')
  if #edge == 0 then
    edge = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  end
  if #edge > 0 and (#newest == 0 or tonumber(edge[2]) > tonumber(newest[2])) then
    redis.call('ZADD', KEYS[4], edge[2], ARGV[7] .. ':' .. edge[2])
  end
end
local front = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #front > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. front[2])
else
  redis.call('DEL', KEYS[4])
end
-- Every place removed above was read from the line in this script: the line is now
-- `waiting - abandoned` long.
return {redis.call('ZCARD', KEYS[2]), waiting - abandoned, heads, abandoned, carried, first,
        suspended, numbers_gone}
