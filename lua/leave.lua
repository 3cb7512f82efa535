-- leave.lua: take a ticket out of the waiting line or give its active slot back.
--
-- KEYS[1]  waiting zset of the shard
-- KEYS[2]  active zset of the shard
-- KEYS[3]  last-seen zset of the shard
-- ARGV[1]  the ticket's line member (EventConfig::member)
-- Returns  {number of sets the ticket was removed from (0 = unknown ticket), its line score
--          when it was waiting (else false)}: a global_counter number that waits no more is
--          recorded as a gap (lua/gap.lua)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local removed = redis.call('ZREM', KEYS[1], ARGV[1]) + redis.call('ZREM', KEYS[2], ARGV[1])
return {removed, score}
