-- nl_figures.lua: the numbered line's figures for the admin API. Keys: see
-- lua/numbered_lib.lua (prepended).
--
-- ARGV[1]  now, ms
-- ARGV[2]  active session length, ms
-- Returns  {waiting, active, admitted since the event began}
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local b, e, gb = line_figures()
local seq = tonumber(redis.call('GET', KEYS[6])) or 0
-- Sessions lapsed since the last tick are still counted by `e`: skip the ticks that ran out.
local ticks = redis.call('ZRANGE', KEYS[4], 0, 999, 'WITHSCORES')
for i = 1, #ticks, 2 do
  local at = tonumber(string.match(ticks[i], '^%d+:(%d+):'))
  if at + ttl > now then
    break
  end
  e = math.max(e, tonumber(ticks[i + 1]))
end
local active = 0
if b > e then
  active = (b - e) - redis.call('BITCOUNT', KEYS[2], e, b - 1, 'BIT')
    - redis.call('BITCOUNT', KEYS[3], e, b - 1, 'BIT')
end
local waiting = 0
if seq >= b then
  waiting = (seq - b + 1) - (departed_below(seq + 1) - gb)
end
return {waiting, active, (b - 1) - gb}
