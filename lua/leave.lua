-- leave.lua: take a ticket out of the waiting line or give its active slot back.
--
-- KEYS[1]  waiting zset of the shard
-- KEYS[2]  active zset of the shard
-- KEYS[3]  last-seen zset of the shard
-- ARGV[1]  the ticket's line member (EventConfig::member)
-- Returns  number of sets the ticket was removed from (0 = unknown ticket)
redis.call('ZREM', KEYS[3], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1]) + redis.call('ZREM', KEYS[2], ARGV[1])
