-- nl_enter.lua: a batch of enters into a numbered line whose index lives in the event's slot
-- (`index_in_line`): for each member, its number and standing, in arrival order. Keys: see
-- lua/numbered_lib.lua (prepended); KEYS[8..] the index buckets the members' entries live in.
--
-- ARGV[1]  now, ms
-- ARGV[2]  active session length, ms
-- ARGV[3]  the horizon: a new number near the front (below `horizon_edge` in
--          lua/numbered_lib.lua) records its entry
-- ARGV[4]  the records' period, ms (see nl_status.lua)
-- ARGV[5..] the members, in arrival order; member ARGV[i] lives in index bucket KEYS[i + 3]
--          (a bucket is named once per member, so a key may repeat)
-- Returns  c, then for each member its number n, then (kind, value) for each member whose n was
--          sent negated, in order (nl_status.lua's standing of n: 0 waiting with its position, 1
--          admitted at ms). A number of this batch is sent as it is: it waits at position
--          max(1, n - c), c being the boundary less one plus the departures at or past it. Only a
--          place kept (a re-entry) is sent negated with its standing. Compact because the
--          service parses every integer of the reply (~1.1k instructions each in redis-rs) and
--          nearly every enter of a surge is a new number.
--
-- A member the index already holds keeps its number while that place holds (waiting or
-- admitted): entering again never moves anyone back. Otherwise (new, or its place is gone: left,
-- lapsed, removed as abandoned) it takes the counter's next number, at the back. No number is
-- taken that is not written into the index in the same script, so none is left unheld.
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local horizon = tonumber(ARGV[3])
local period = math.floor(now / tonumber(ARGV[4]))
-- Nothing departs in this script: the boundary and the departures are read once, and a new
-- number lies above every departure (only numbers handed out depart).
local f = redis.call('HMGET', KEYS[1], 'b', 'gb', 't', 'he')
local b, gb, t = tonumber(f[1]) or 1, tonumber(f[2]) or 0, tonumber(f[3]) or 0
local edge = horizon_edge(b, horizon, tonumber(f[4]) or 0)
-- A new number is the one after the counter, claimed by HSETNX (the member has none yet); the
-- counter is written once, after the loop, to the last number claimed: one command per batch
-- where an INCR per enter cost ~0.6 us of Redis per enter on the primary and ~0.4 us on the
-- replica (docs/benchmarks.md, "The HTTP layers and the enter script's commands"). The loop
-- runs under pcall, so the counter is written even when a command in it fails part-way (after
-- its first write Redis lets a script's writes through, and a failed command ends a script
-- without undoing what it wrote): the counter is never behind a number in the index. The GET
-- below fails first, before any write, on a counter of the wrong type. A member twice in the
-- batch is answered the same twice.
--
-- The loop allocates no table per enter and converts no argument with tonumber: both cost
-- Redis instructions per enter (~28.4k → ~23.5k per enter of the script, `scripts/bench-enter-script`;
-- docs/benchmarks.md, "The enter script's instructions").
local first = tonumber(redis.call('GET', KEYS[6])) or 0
local top = first
local c = b - 1 + (t - gb)
local out, k = {c}, 1
local kept, j = {}, 0
local function enter_all()
  for i = 5, #ARGV do
    local index, member = KEYS[i + 3], ARGV[i]
    local n, kind, value
    if redis.call('HSETNX', index, member, top + 1) == 1 then
      top = top + 1
      n = top
    else
      local held = tonumber(redis.call('HGET', index, member))
      if held > first then
        -- Handed out earlier in this batch (the member is twice in it): the same answer. Its
        -- standing cannot be read yet: the counter is written after the loop.
        n = held
      else
        local s = standing(held, now, ttl)
        if s[1] ~= 2 then
          n, kind, value = held, s[1], s[2]
        else
          -- The place is gone: a new number at the back.
          top = top + 1
          n = top
          redis.call('HSET', index, member, n)
        end
      end
    end
    k = k + 1
    if not kind then
      -- A number of this batch: every departure lies below it, so it waits at max(1, n - c).
      out[k] = n
    else
      out[k] = -n
      kept[j + 1], kept[j + 2] = kind, value
      j = j + 2
    end
  end
end
local ok, err = pcall(enter_all)
if top ~= first then
  redis.call('SET', KEYS[6], top, 'KEEPTTL')
  -- The numbers of this batch, first + 1 to top, near the front: entered, never polled (as
  -- nl_status.lua's 'enter'), in one write. None had a record (no script records a number
  -- above the counter), so none is read first; a member twice in the batch holds one of them.
  -- One command per batch where a GETRANGE and a SETRANGE per enter cost more than the rest of
  -- the enter (docs/benchmarks.md, "Records of a batch in one write").
  local last = math.min(top, edge - 1)
  if last > first then
    redis.call('SETRANGE', KEYS[5], 2 * (first + 1), string.rep(cell(false, period), last - first))
  end
end
if not ok then
  error(err)
end
for i = 1, j do
  out[k + i] = kept[i]
end
return out
