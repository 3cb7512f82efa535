-- gap.lua: record a global_counter number that waits nowhere, so that counted positions behind
-- it do not count it (strategies/src/global_counter.rs).
--
-- A number waits nowhere when it was handed out to someone already in the line or inside (an
-- enter takes its number before its shard is read: src/queue/mod.rs, `enter_counted`), or when
-- its holder left the line.
--
-- KEYS[1]  the event's live-figures hash (gc_start, gc_first: lua/publish_counter.lua)
-- KEYS[2]  the event's counter gaps (zset: number → number)
-- ARGV[1]  the number
-- ARGV[2]  the event's counter range (its first number, EventConfig::counter_start)
-- Returns  1 recorded, 0 not needed (already behind the first number still waiting)
--
-- Invariant, with lua/publish_counter.lua: every recorded gap is at or after the published
-- first number still waiting, so a poll's ZCOUNT of the gaps below its own number counts exactly
-- the gaps between the head and itself.
--
-- It also drops the gaps behind the published first number, as the leader's publication does:
-- while a leader of the version before this set leads (a rolling upgrade), nobody else would.
local f = redis.call('HMGET', KEYS[1], 'gc_start', 'gc_first')
if f[1] == ARGV[2] and f[2] and f[2] ~= '' then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. f[2])
  if tonumber(ARGV[1]) < tonumber(f[2]) then
    return 0
  end
end
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[1])
return 1
