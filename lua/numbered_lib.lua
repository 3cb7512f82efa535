-- numbered_lib.lua: shared prelude of the numbered line's scripts (nl_*.lua; prepended when
-- they are loaded, see src/redis/scripts.rs). docs/numbered-line.md describes the layout.
--
-- Every person holds an arrival number n (1, 2, …) from the event's counter. The numbered
-- scripts all run on the event's slot and take the same keys:
--
-- KEYS[1]  the line (hash): `b` the boundary (the first number not yet admitted, 1 at first),
--          `e` the first number whose session may still be live, `gb` departures below `b`,
--          `t` all departures, `m` the highest block holding one, `p<k>` departures in the
--          blocks before block k (k ≤ m; a block is BLOCK numbers), `he` the furthest edge of
--          the horizon a tick has used (see `horizon_edge`)
-- KEYS[2]  departures (bitmap): bit n set when n stopped waiting without being admitted (left,
--          removed as abandoned, or a re-entry's spare number)
-- KEYS[3]  ended sessions (bitmap): bit n set when admitted n ended early (booked, or left)
-- KEYS[4]  ticks (zset): one per tick that moved the boundary, scored by the boundary after it,
--          member '<boundary>:<time ms>:<counter then>:<horizon edge after it>' (ticks of an
--          earlier version have no edge: theirs is read as boundary + the horizon now)
-- KEYS[5]  last-seen records near the front (string): two bytes per number n at offset 2n, 0
--          for none, else whether n has polled (or only entered) and in which period
--          (see `record_of`)
-- KEYS[6]  the counter (string)
-- KEYS[7]  the last tick's operation id (string)
--
-- A number n is waiting when n ≥ b and bit n of KEYS[2] is clear; admitted with a live session
-- when e ≤ n < b, both bits are clear and the first tick above n is younger than the session
-- length; gone otherwise. Its position is n − b + 1 less the departures between b and n.

local BLOCK = 32768

-- Last-seen records are kept by period (a period is the poll refresh, a quarter of the abandon
-- time): a cell holds 32768 × polled + (period mod 32767) + 1, big-endian. A poll rewrites its
-- cell once per period at most; nothing is ever removed (a cell past the boundary is dead weight,
-- two bytes). Ages are read mod 32767 periods (5.7 days at 15 s): older records read as newer.
local WRAP = 32767

local function cell(polled, period)
  local v = (polled and 32768 or 0) + period % WRAP + 1
  return string.char(math.floor(v / 256), v % 256)
end

-- The record in `bytes` (a GETRANGE starting at number `first`) of number n: nil for none, else
-- (polled, age in periods at `period`).
local function record_at(bytes, first, n, period)
  local i = 2 * (n - first) + 1
  local hi, lo = string.byte(bytes, i, i + 1)
  if not hi or not lo then
    return nil
  end
  local v = hi * 256 + lo
  if v == 0 then
    return nil
  end
  local polled = v >= 32768
  return polled, (period - ((v % 32768) - 1)) % WRAP
end

-- Records of numbers first..last, one GETRANGE.
local function records(first, last)
  return redis.call('GETRANGE', KEYS[5], 2 * first, 2 * last + 1)
end

-- Departures among the numbers below n: the prefix sum of n's block and one partial BITCOUNT.
local function departed_below(n)
  local k = math.floor(n / BLOCK)
  local f = redis.call('HMGET', KEYS[1], 'p' .. k, 'm', 't')
  local m = tonumber(f[2]) or -1
  if k > m then
    -- Every departure lies in a block before this one.
    return tonumber(f[3]) or 0
  end
  local start = k * BLOCK
  local within = 0
  if n - 1 >= start then
    within = redis.call('BITCOUNT', KEYS[2], start, n - 1, 'BIT')
  end
  return (tonumber(f[1]) or 0) + within
end

-- Marks the waiting numbers `ns` (ascending) as departed and keeps the prefix sums: one
-- HINCRBY per later block, not one per departure. Returns how many were newly marked.
local function depart(ns)
  local added = {}
  for _, n in ipairs(ns) do
    if redis.call('SETBIT', KEYS[2], n, 1) == 0 then
      added[#added + 1] = n
    end
  end
  if #added == 0 then
    return 0
  end
  local f = redis.call('HMGET', KEYS[1], 'm', 't')
  local m, t = tonumber(f[1]) or -1, tonumber(f[2]) or 0
  local top = math.floor(added[#added] / BLOCK)
  -- For each block j after the first one touched: the new departures in blocks before j.
  local i, below = 1, 0
  local first = math.floor(added[1] / BLOCK)
  local sets = {}
  for j = first + 1, math.max(m, top) do
    while added[i] and math.floor(added[i] / BLOCK) < j do
      below = below + 1
      i = i + 1
    end
    if j > m then
      -- A block with no sum yet: every departure before this call lies before it.
      sets[#sets + 1] = 'p' .. j
      sets[#sets + 1] = t + below
    elseif below > 0 then
      redis.call('HINCRBY', KEYS[1], 'p' .. j, below)
    end
  end
  if top > m then
    -- Blocks after the old highest and up to the first touched have no departure among the new.
    for j = m + 1, first do
      sets[#sets + 1] = 'p' .. j
      sets[#sets + 1] = t
    end
    sets[#sets + 1] = 'm'
    sets[#sets + 1] = top
  end
  sets[#sets + 1] = 't'
  sets[#sets + 1] = t + #added
  redis.call('HSET', KEYS[1], unpack(sets))
  return #added
end

-- b, e, gb and `he` (0 before any tick wrote it).
local function line_figures()
  local f = redis.call('HMGET', KEYS[1], 'b', 'e', 'gb', 'he')
  return tonumber(f[1]) or 1, tonumber(f[2]) or 1, tonumber(f[3]) or 0, tonumber(f[4]) or 0
end

-- The edge of the horizon: the numbers below it are near the front, where polls and enters
-- keep last-seen records and the tick may judge someone gone. The horizon follows the rate
-- (src/queue/mod.rs, `horizon`), but its edge never moves back: `he` holds the furthest edge a
-- tick has used. Once inside, always inside: a lower rate (a pause at 0, say) must not stop
-- the records of people already inside, or when the rate rose again the tick would find their
-- last record older than the abandon bound and take them for gone while they poll as told.
-- (The sorted line does the same: a poll refreshes a record wherever its holder stands.)
local function horizon_edge(b, horizon, he)
  return math.max(b + horizon, he)
end

-- Sessions that ran out by `now`, whole ticks at a time: the first number whose session may
-- still be live (at least `e`), and the members of the ticks that ran out.
local function lapsed(e, now, ttl)
  local ticks = redis.call('ZRANGE', KEYS[4], 0, 999, 'WITHSCORES')
  local out = {}
  for i = 1, #ticks, 2 do
    local at = tonumber(string.match(ticks[i], '^%d+:(%d+):'))
    if at + ttl > now then
      break
    end
    e = math.max(e, tonumber(ticks[i + 1]))
    out[#out + 1] = ticks[i]
  end
  return e, out
end

-- Live sessions: the numbers from `e` up to the boundary `b`, less those that departed before
-- it passed them and those whose session ended.
local function active_between(e, b)
  if b <= e then
    return 0
  end
  return (b - e) - redis.call('BITCOUNT', KEYS[2], e, b - 1, 'BIT')
    - redis.call('BITCOUNT', KEYS[3], e, b - 1, 'BIT')
end

-- People waiting: the numbers from the boundary `b` to the counter `seq`, less the departures
-- among them (`gb`: the departures below `b`).
local function waiting_from(b, gb, seq)
  if seq < b then
    return 0
  end
  return (seq - b + 1) - (departed_below(seq + 1) - gb)
end

-- When admitted n was let in (ms): the time of the first tick whose boundary passed it.
local function admitted_at(n)
  local t = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. n, '+inf', 'LIMIT', 0, 1)
  if #t == 0 then
    return nil
  end
  return tonumber(string.match(t[1], '^%d+:(%d+):'))
end

-- Where number n stands: {0, position} waiting, {1, admitted at ms} admitted and live,
-- {2, 0} gone (left, abandoned, session over or lapsed, or never handed out); and the boundary
-- and `he` it was read against, so a caller needs no second read of the line's figures.
local function standing(n, now, ttl)
  local b, e, gb, he = line_figures()
  if n < 1 or n > (tonumber(redis.call('GET', KEYS[6])) or 0) then
    return {2, 0}, b, he
  end
  if redis.call('GETBIT', KEYS[2], n) == 1 then
    return {2, 0}, b, he
  end
  if n >= b then
    return {0, n - b + 1 - (departed_below(n) - gb)}, b, he
  end
  if n < e or redis.call('GETBIT', KEYS[3], n) == 1 then
    return {2, 0}, b, he
  end
  local at = admitted_at(n)
  if not at or at + ttl <= now then
    return {2, 0}, b, he
  end
  return {1, at}, b, he
end

-- A number that waits nowhere (a re-entry's spare): departed while waiting, ended if a tick
-- already admitted it (a departure below the boundary `b` would shift the positions' base).
local function drop(n, b)
  if n >= b then
    depart({n})
  else
    redis.call('SETBIT', KEYS[3], n, 1)
  end
end
