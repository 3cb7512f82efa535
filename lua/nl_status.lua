-- nl_status.lua: where number n stands on the numbered line, and its last-seen record.
-- Keys: see lua/numbered_lib.lua (prepended).
--
-- ARGV[1]  n
-- ARGV[2]  now, ms
-- ARGV[3]  active session length, ms
-- ARGV[4]  'enter': n was just handed out (its record, near the front, is -now: entered, never
--          polled); 'poll': a poll (its record, near the front, becomes now when older than
--          ARGV[6]); 'check': a read that records nothing (a hold's session check)
-- ARGV[5]  the horizon: only numbers within this many of the boundary keep a record
-- ARGV[6]  a poll rewrites its record when older than this, ms
-- Returns  {0, position} waiting, {1, admitted at ms} admitted and live, {2, 0} gone
local n, now = tonumber(ARGV[1]), tonumber(ARGV[2])
local s = standing(n, now, tonumber(ARGV[3]))
if s[1] == 0 and ARGV[4] ~= 'check' then
  local b = line_figures()
  if n - b < tonumber(ARGV[5]) then
    if ARGV[4] == 'enter' then
      redis.call('ZADD', KEYS[5], 'NX', -now, n)
    else
      local seen = tonumber(redis.call('ZSCORE', KEYS[5], n))
      if not seen or seen < 0 or seen < now - tonumber(ARGV[6]) then
        redis.call('ZADD', KEYS[5], now, n)
      end
    end
  end
end
return s
