-- nl_tick.lua: one admission tick of the numbered line. Keys: see lua/numbered_lib.lua
-- (prepended).
--
-- ARGV[1]  budget: at most this many admitted
-- ARGV[2]  active capacity
-- ARGV[3]  now, ms (the tick's time: admitted now)
-- ARGV[4]  active session length, ms
-- ARGV[5]  abandon bound for people who have polled (or came near the front without a record
--          since), ms: last seen at or before it, they are taken for gone, not admitted
-- ARGV[6]  abandon bound for entries that never polled (negative records)
-- ARGV[7]  the longer bound for people who have polled while the overload guard holds
-- ARGV[8]  the horizon: how many numbers from the boundary keep a last-seen record (its edge
--          never moves back: `horizon_edge` in lua/numbered_lib.lua)
-- ARGV[9]  fence: admit nobody once this node's clock (TIME, ms) reaches it ('' = none); see
--          lua/admit.lua
-- ARGV[10] this operation's id ('' = none): a second run with the same id changes nothing
-- ARGV[11] the records' period, ms (see lua/numbered_lib.lua)
-- ARGV[12] the overload guard as an earlier step of the same tick found it ('0' or '1'), or ''
--          to judge it here
-- Returns  {admitted, abandoned, active after, waiting after, status (0 done, 1 fenced,
--           2 already ran), 1 when the overload guard held, the boundary after}
--
-- Nobody is moved: admitting is advancing the boundary past the next `take` numbers still
-- waiting, and nothing is removed. What grows with the number passed is the read that decides
-- who is still there: per 1,024 numbers one GETRANGE of their departure bits and one of their
-- records, decoded here.
if ARGV[10] ~= '' and redis.call('GET', KEYS[7]) == ARGV[10] then
  return {0, 0, 0, 0, 2, 0, 0}
end
if ARGV[9] ~= '' then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) >= tonumber(ARGV[9]) then
    return {0, 0, 0, 0, 1, 0, 0}
  end
end
local budget, capacity = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local cut_polled, cut_entered = tonumber(ARGV[5]), tonumber(ARGV[6])
local horizon = tonumber(ARGV[8])
local span = tonumber(ARGV[11])
-- Read once as locals: the loops below run once per number passed (5,000 for a tick letting
-- 5,000 in), and a global is a table lookup at each use.
local floor, sbyte, band, rshift = math.floor, string.byte, bit.band, bit.rshift
local period = floor(now / span)
-- A record of period p is after a bound c when p ≥ floor(c / span): a record in the period that
-- holds the bound counts as after it (lenient by less than a period). A record of age `age` is
-- so fresh for the bound c when period − age ≥ oldest(c), worked out once per bound.
local function oldest(cut)
  return floor(cut / span)
end
local b, e, gb, he0 = line_figures()
local e0 = e
local seq = tonumber(redis.call('GET', KEYS[6])) or 0

-- Sessions that ran out: `e` moves to the boundary of the newest tick at least a session old.
local expired_ticks
e, expired_ticks = lapsed(e, now, ttl)
local active = active_between(e, b)
local take = math.max(0, math.min(budget, capacity - active))

-- The overload guard (as lua/shard_heads.lua, over the first 1,024 numbers from the boundary):
-- when fewer than half of those who have polled were seen after the bound, their polls are
-- likelier not reaching the service than all gone; people who have polled are then held to the
-- longer bound. Entries that never polled neither count nor are covered.
local suspended = 0
-- The guard's reads of the first 1,024 numbers serve the first chunk below too.
local first_bytes, first_recs = nil, nil
if ARGV[12] ~= '' then
  suspended = tonumber(ARGV[12])
  if suspended == 1 then
    cut_polled = tonumber(ARGV[7])
  end
elseif seq >= b then
  local last = math.min(b + 1023, seq)
  local recs = records(b, last)
  local bytes = redis.call('GETRANGE', KEYS[2], math.floor(b / 8), math.floor(last / 8))
  first_bytes, first_recs = bytes, recs
  local polled, recent = 0, 0
  local fresh_from, fb = oldest(cut_polled), floor(b / 8)
  -- record_at of lua/numbered_lib.lua written out, and n's departure bit (bit 7 - n % 8 of the
  -- byte holding n): only cells of people who have polled count, and a departed number's
  -- record stays behind it and counts for nobody.
  for n = b, last do
    local i = 2 * (n - b) + 1
    local hi, lo = sbyte(recs, i, i + 1)
    if hi and lo and hi >= 128 then
      local byte = sbyte(bytes, floor(n / 8) - fb + 1) or 0
      if band(rshift(byte, 7 - n % 8), 1) == 0 then
        polled = polled + 1
        local age = (period - (((hi * 256 + lo) % 32768) - 1)) % WRAP
        if period - age >= fresh_from then
          recent = recent + 1
        end
      end
    end
  end
  if polled >= 100 and 2 * recent < polled then
    suspended = 1
    cut_polled = tonumber(ARGV[7])
  end
end

-- Who of the numbers from the boundary on is still there, 1,024 at a time, until `take` found.
-- With no room left (take 0) the first min(budget, 1,024) are judged all the same, as the sorted
-- line reads its heads whatever the capacity: abandoned places at the front stop counting in
-- the positions behind them before a slot frees.
local probe = math.min(budget, 1024)
local judged = 0
local admit, gone = {}, {}
local na, ng = 0, 0
local last_admitted = nil
local CHUNK = 1024
local x = b
-- The ticks near the front, for "came inside the horizon when" (read once).
local crossings = nil
local j = 1
local polled_from, entered_from = oldest(cut_polled), oldest(cut_entered)
while (na < take or judged < probe) and x <= seq do
  local last = math.min(x + CHUNK - 1, seq)
  local bytes, recs = first_bytes, first_recs
  if x ~= b or not bytes then
    bytes = redis.call('GETRANGE', KEYS[2], floor(x / 8), floor(last / 8))
    recs = nil
  end
  -- The numbers of x..last whose departure bit is clear; a byte with no bit set gives its
  -- numbers without a test each.
  local cands, nc = {}, 0
  local fx = floor(x / 8)
  local n = x
  while n <= last do
    local byte = sbyte(bytes, floor(n / 8) - fx + 1) or 0
    if byte == 0 then
      local stop = math.min(last, floor(n / 8) * 8 + 7)
      for m = n, stop do
        nc = nc + 1
        cands[nc] = m
      end
      n = stop + 1
    else
      if band(rshift(byte, 7 - n % 8), 1) == 0 then
        nc = nc + 1
        cands[nc] = n
      end
      n = n + 1
    end
  end
  if nc > 0 then
    recs = recs or records(x, last)
    for k = 1, nc do
      local n = cands[k]
      judged = judged + 1
      -- record_at of lua/numbered_lib.lua, written out.
      local i = 2 * (n - x) + 1
      local hi, lo = sbyte(recs, i, i + 1)
      local v = (hi and lo) and hi * 256 + lo or 0
      local away
      if v >= 32768 then
        away = period - (period - ((v % 32768) - 1)) % WRAP < polled_from
      elseif v > 0 then
        away = period - (period - (v - 1)) % WRAP < entered_from
      else
        -- No record: inside the horizon since the first tick whose edge passed n, once n had
        -- been handed out; never judged before that. The edge is the one that tick used (its
        -- member's last field), not one worked out from today's horizon: a rate raised since
        -- widens the horizon, and the people it takes in came inside with the raise, not at
        -- ticks long before it (they may have polled as told, further back, where nothing is
        -- recorded). Edges never move back, so candidates ascend and so does that tick: one
        -- pointer over the ticks, read once, from the boundaries within the widest reach
        -- (a tick further back is passed over: n is taken in later, never earlier).
        if not crossings then
          crossings = {}
          local reach = math.max(horizon, he0 - b)
          local raw = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. math.max(0, n - reach), '+inf')
          for _, c in ipairs(raw) do
            local cb, at, cseq, edge = string.match(c, '^(%d+):(%d+):(%d+):?(%d*)')
            crossings[#crossings + 1] = {tonumber(edge) or tonumber(cb) + horizon, tonumber(at),
                                         tonumber(cseq)}
          end
        end
        while crossings[j] and (crossings[j][1] <= n or crossings[j][3] < n) do
          j = j + 1
        end
        away = crossings[j] ~= nil and crossings[j][2] <= cut_polled
      end
      if away then
        ng = ng + 1
        gone[ng] = n
      elseif na < take then
        na = na + 1
        admit[na] = n
        last_admitted = n
      end
      if na >= take and judged >= probe then
        break
      end
    end
  end
  x = last + 1
end

-- Writes only from here: a failed read above leaves the line as it was. A tick that changes
-- nothing writes nothing (an idle line's ticks do not replicate).
local changes = #admit > 0 or #gone > 0 or #expired_ticks > 0
if changes and ARGV[10] ~= '' then
  redis.call('SET', KEYS[7], ARGV[10], 'PX', 600000)
end
if #expired_ticks > 0 then
  redis.call('ZREM', KEYS[4], unpack(expired_ticks))
end
local abandoned = depart(gone)
local nb = b
if last_admitted then
  nb = last_admitted + 1
  gb = departed_below(nb)
end
-- The edge after this tick: further when the boundary moved or the rate (so the horizon) rose.
local he = horizon_edge(nb, horizon, he0)
if last_admitted then
  redis.call('ZADD', KEYS[4], nb, nb .. ':' .. now .. ':' .. seq .. ':' .. he)
end
if nb ~= b or e ~= e0 or he ~= he0 then
  redis.call('HSET', KEYS[1], 'b', nb, 'e', e, 'gb', gb, 'he', he)
end
return {#admit, abandoned, active + #admit, waiting_from(nb, gb, seq), 0, suspended, nb}
