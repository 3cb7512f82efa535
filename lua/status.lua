-- status.lua: where a ticket stands in its own shard (the poll path).
--
-- KEYS[1]  waiting zset of the shard
-- KEYS[2]  active zset of the shard
-- KEYS[3]  last-seen zset of the shard
-- ARGV[1]  ticket
-- ARGV[2]  now, ms
-- ARGV[3]  active session length, ms
-- ARGV[4]  seen refresh, ms: a poll within this long of the last one recorded writes nothing
-- Returns  {2, admitted_at_ms, 0, 0}      active
--          {1, score, rank, shard_size}  waiting (and marks the ticket seen now)
--          {0, '0', 0, 0}                unknown, left, or session over (a lapsed session is removed)
--
-- Marking "seen" is the one write of a poll, and it is skipped while the last recorded poll is
-- younger than ARGV[4] (a quarter of the event's abandon time): most polls then write nothing
-- and replicate nothing. The admission pushes its abandon bounds back by the same ARGV[4]
-- (admission.rs, `abandon_bound`), so nobody who polled within abandon_after_seconds is taken
-- for gone: a skipped poll at t means a recorded one after t - ARGV[4].
local adm = redis.call('ZSCORE', KEYS[2], ARGV[1])
if adm then
  if tonumber(adm) + tonumber(ARGV[3]) > tonumber(ARGV[2]) then
    return {2, adm, 0, 0}
  end
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {0, '0', 0, 0}
end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return {0, '0', 0, 0}
end
local seen = tonumber(redis.call('ZSCORE', KEYS[3], ARGV[1]))
if not (seen and seen > 0 and seen > tonumber(ARGV[2]) - tonumber(ARGV[4])) then
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
end
return {1, score, redis.call('ZRANK', KEYS[1], ARGV[1]), redis.call('ZCARD', KEYS[1])}
