-- nl_reenter.lua: someone entered again and was handed a new number n while the index still
-- holds their old number. Keys: see lua/numbered_lib.lua (prepended).
--
-- ARGV[1]  the old number
-- ARGV[2]  the new number n
-- ARGV[3]  now, ms
-- ARGV[4]  active session length, ms
-- Returns  {1, kind, value}: the old place holds (waiting or admitted, as nl_status.lua's
--          standing); n waits nowhere and is dropped
--          {0, kind, value}: the old place is gone; n is the person's number from now on (the
--          caller writes it into the index), with n's standing
-- Refresh-safe: entering again never moves anyone back while their place holds.
local old, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local s, b = standing(old, now, ttl)
if s[1] ~= 2 then
  if n ~= old then
    drop(n, b)
  end
  return {1, s[1], s[2]}
end
local t = standing(n, now, ttl)
return {0, t[1], t[2]}
