-- lease_release.lua: give the admission lease up, only if this instance holds it.
--
-- KEYS[1]  lease key
-- ARGV[1]  this instance's id
-- Returns  1 when released, 0 when held by another instance or by nobody
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
