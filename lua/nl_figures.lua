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
e = lapsed(e, now, ttl)
return {waiting_from(b, gb, seq), active_between(e, b), (b - 1) - gb}
