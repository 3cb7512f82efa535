-- lease.lua: take or renew the admission lease of one event.
--
-- KEYS[1]  lease key
-- ARGV[1]  this instance's id
-- ARGV[2]  lease length, ms
-- Returns  {1, lapse} when this instance holds the lease now, {0, 0} when another does. `lapse`
--          is when the lease lapses unless renewed, in ms of this node's clock (TIME): the
--          caller fences its admissions by it (lua/admit.lua), so a tick that outlives its
--          lease admits nobody.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, now_ms() + tonumber(ARGV[2])}
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, now_ms() + tonumber(ARGV[2])}
end
return {0, 0}
