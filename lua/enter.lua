-- enter.lua: put a ticket in its shard's waiting line, or report that it is already active.
--
-- KEYS[1]  waiting zset of the shard   (member → arrival order key)
-- KEYS[2]  active zset of the shard    (member → admission time, ms)
-- KEYS[3]  last-seen zset of the shard (member → last poll, ms; or minus the last enter, for
--          someone who has not polled yet)
-- ARGV[1]  the ticket's line member (EventConfig::member: 14 characters, or the ticket)
-- ARGV[2]  arrival score (microseconds from the instance clock, or the event's counter)
-- ARGV[3]  now, ms
-- ARGV[4]  active session length, ms
-- ARGV[5]  the shard's horizon: only the first this many of the line keep a last-seen record
--          (see shard_heads.lua); someone entering further back records nothing
-- Returns  {2, admitted_at_ms, 0, 0}       when the ticket holds a live active session
--          {1, score, rank, shard_size}   when it waits (rank 0-based within the shard)
--
-- ZADD NX: entering again never changes the stored score, so nobody is ever moved back.
-- An active session that has run out is dropped here and the ticket queues anew at the back.
local adm = redis.call('ZSCORE', KEYS[2], ARGV[1])
if adm then
  if tonumber(adm) + tonumber(ARGV[4]) > tonumber(ARGV[3]) then
    return {2, adm, 0, 0}
  end
  redis.call('ZREM', KEYS[2], ARGV[1])
end
local added = redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1])
local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
-- Last seen, only inside the horizon: an entry that has never polled is kept negative (-now), so
-- the overload guard counts only people who have polled (shard_heads.lua); once polled, entering
-- counts as a poll. Further back nothing is written: shard_heads.lua stamps people as the line
-- brings them inside.
if rank < tonumber(ARGV[5]) then
  local seen = redis.call('ZSCORE', KEYS[3], ARGV[1])
  if seen and tonumber(seen) > 0 then
    redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
  else
    redis.call('ZADD', KEYS[3], -tonumber(ARGV[3]), ARGV[1])
  end
end
-- A new place has the score just given; only someone already waiting needs theirs read.
local score = ARGV[2]
if added == 0 then
  score = redis.call('ZSCORE', KEYS[1], ARGV[1])
end
return {1, score, rank, redis.call('ZCARD', KEYS[1])}
