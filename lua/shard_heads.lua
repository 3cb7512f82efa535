-- shard_heads.lua: first step of an admission tick for one shard.
-- Ends lapsed active sessions, then reports the shard's sizes and the first `k` waiting.
--
-- KEYS[1]  waiting zset of the shard
-- KEYS[2]  active zset of the shard
-- ARGV[1]  expiry bound, ms: sessions admitted at or before it have run out (now - ttl)
-- ARGV[2]  k, how many heads to return (0 = none)
-- Returns  {active_count, waiting_count, {member1, score1, member2, score2, ...}}
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
local k = tonumber(ARGV[2])
local heads = {}
if k > 0 then
  heads = redis.call('ZRANGE', KEYS[1], 0, k - 1, 'WITHSCORES')
end
return {redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[1]), heads}
