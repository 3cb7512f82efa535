-- seen.lua: a poll's first record inside its shard's horizon (see lua/shard_heads.lua).
--
-- KEYS[1]  waiting zset of the shard
-- KEYS[2]  last-seen zset of the shard
-- ARGV[1]  the ticket's line member (EventConfig::member)
-- ARGV[2]  now, ms
-- Returns  1 when recorded, 0 when the ticket no longer waits
--
-- Written only while the ticket still waits: a ticket admitted or gone since the poll read the
-- line must not get a record back (the admission and leave.lua remove records with the place).
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
  return 1
end
return 0
