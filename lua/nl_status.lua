-- nl_status.lua: where number n stands on the numbered line, and its last-seen record.
-- Keys: see lua/numbered_lib.lua (prepended).
--
-- ARGV[1]  n, or 0: the number the index holds for member ARGV[8] in bucket KEYS[8] (a line
--          whose index lives in the event's slot; a ticket this instance does not know)
-- ARGV[2]  now, ms
-- ARGV[3]  active session length, ms
-- ARGV[4]  'enter': n was just handed out (its record, near the front: entered, never polled);
--          'poll': a poll (its record, near the front: polled, this period); 'check': a read
--          that records nothing (a hold's session check)
-- ARGV[5]  the horizon: only numbers within this many of the boundary, or below the edge a tick
--          reached before (`horizon_edge` in lua/numbered_lib.lua), keep a record
-- ARGV[6]  the records' period, ms (fixed with the line: `record_period_ms` in
--          src/queue/event.rs)
-- ARGV[7]  the poll refresh in periods (at least 1): a poll rewrites its record once it is this
--          many periods old
-- ARGV[8]  with ARGV[1] 0: the member
-- Returns  {0, position, recorded} waiting, {1, admitted at ms, 0} admitted and live, {2, 0, 0}
--          gone; recorded is 1 when a poll's record is current for this period (written now or
--          earlier in it), so the instance may skip the script for its polls until the next
--          period (src/queue/snapshot.rs); and fourth, n ({2, 0, 0, 0}: the index holds none)
local n, now = tonumber(ARGV[1]), tonumber(ARGV[2])
if n == 0 then
  n = tonumber(redis.call('HGET', KEYS[8], ARGV[8]))
  if not n then
    return {2, 0, 0, 0}
  end
end
local s, b, he = standing(n, now, tonumber(ARGV[3]))
s[3] = 0
s[4] = n
if s[1] == 0 and ARGV[4] ~= 'check' then
  if n < horizon_edge(b, tonumber(ARGV[5]), he) then
    if ARGV[4] == 'poll' then
      s[3] = 1
    end
    local period = math.floor(now / tonumber(ARGV[6]))
    local polled, age = record_at(records(n, n), n, n, period)
    if ARGV[4] == 'enter' then
      -- An entry's record says entered, never polled; it never overwrites a poll's.
      if polled == nil then
        redis.call('SETRANGE', KEYS[5], 2 * n, cell(false, period))
      end
    elseif not polled or age >= tonumber(ARGV[7]) then
      redis.call('SETRANGE', KEYS[5], 2 * n, cell(true, period))
    end
  end
end
return s
