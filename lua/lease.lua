-- lease.lua: take or renew the admission lease of one event.
--
-- KEYS[1]  lease key
-- ARGV[1]  this instance's id
-- ARGV[2]  lease length, ms
-- Returns  1 when this instance holds the lease now, 0 when another does
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
