-- nl_leave.lua: number n leaves the line, or ends its active session (after a purchase, or a
-- leave once admitted). Keys: see lua/numbered_lib.lua (prepended).
--
-- ARGV[1]  n
-- ARGV[2]  now, ms
-- ARGV[3]  active session length, ms
-- Returns  1 when n was waiting or admitted, 0 when it was gone already
local n, now = tonumber(ARGV[1]), tonumber(ARGV[2])
local s = standing(n, now, tonumber(ARGV[3]))
if s[1] == 0 then
  depart({n})
  return 1
elseif s[1] == 1 then
  redis.call('SETBIT', KEYS[3], n, 1)
  return 1
end
return 0
