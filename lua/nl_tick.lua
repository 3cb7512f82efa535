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
-- ARGV[8]  the horizon: how many numbers from the boundary keep a last-seen record
-- ARGV[9]  fence: admit nobody once this node's clock (TIME, ms) reaches it ('' = none); see
--          lua/admit.lua
-- ARGV[10] this operation's id ('' = none): a second run with the same id changes nothing
-- Returns  {admitted, abandoned, active after, waiting after, status (0 done, 1 fenced,
--           2 already ran), 1 when the overload guard held, the boundary after}
--
-- Nobody is moved: admitting is advancing the boundary past the next `take` numbers still
-- waiting, so the tick's writes do not grow with the number admitted. What grows is the read
-- that decides who is still there: the departures' bits of the numbers passed (one GETRANGE per
-- 1,024 numbers) and their last-seen records (one ZMSCORE per 1,024).
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
local b, e, gb = line_figures()
local e0 = e
local seq = tonumber(redis.call('GET', KEYS[6])) or 0

-- Sessions that ran out: `e` moves to the boundary of the newest tick at least a session old.
local expired_ticks
e, expired_ticks = lapsed(e, now, ttl)
local active = active_between(e, b)
local take = math.max(0, math.min(budget, capacity - active))

-- The overload guard (as lua/shard_heads.lua): when fewer than half of those near the front who
-- have polled were seen after the bound, their polls are likelier not reaching the service than
-- all gone; people who have polled are then held to the longer bound.
local suspended = 0
local polled = redis.call('ZCOUNT', KEYS[5], '(0', '+inf')
if polled >= 100 and 2 * redis.call('ZCOUNT', KEYS[5], '(' .. ARGV[5], '+inf') < polled then
  suspended = 1
  cut_polled = tonumber(ARGV[7])
end

-- Who of the numbers from the boundary on is still there, 1,024 at a time, until `take` found.
-- With no room left (take 0) the first min(budget, 1,024) are judged all the same, as the sorted
-- line reads its heads whatever the capacity: abandoned places at the front stop counting in
-- the positions behind them before a slot frees.
local probe = math.min(budget, 1024)
local judged = 0
local admit, gone = {}, {}
local last_admitted = nil
local CHUNK = 1024
local x = b
-- The ticks near the front, for "came inside the horizon when" (read once).
local crossings = nil
local j = 1
while (#admit < take or judged < probe) and x <= seq do
  local last = math.min(x + CHUNK - 1, seq)
  local bytes = redis.call('GETRANGE', KEYS[2], math.floor(x / 8), math.floor(last / 8))
  local base = math.floor(x / 8)
  local cands = {}
  for n = x, last do
    local byte = string.byte(bytes, math.floor(n / 8) - base + 1) or 0
    if bit.band(bit.rshift(byte, 7 - n % 8), 1) == 0 then
      cands[#cands + 1] = n
    end
  end
  if #cands > 0 then
    local seen = redis.call('ZMSCORE', KEYS[5], unpack(cands))
    for i, n in ipairs(cands) do
      judged = judged + 1
      local s = seen[i] and tonumber(seen[i])
      local away
      if s and s > 0 then
        away = s <= cut_polled
      elseif s then
        away = -s <= cut_entered
      else
        -- No record: inside the horizon since the first tick whose boundary came within
        -- `horizon` of n, once n had been handed out; never judged before that. Candidates
        -- ascend and so does that tick: one pointer over the ticks, read once.
        if not crossings then
          crossings = {}
          local raw = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. math.max(0, n - horizon), '+inf')
          for _, c in ipairs(raw) do
            local cb, at, cseq = string.match(c, '^(%d+):(%d+):(%d+)')
            crossings[#crossings + 1] = {tonumber(cb), tonumber(at), tonumber(cseq)}
          end
        end
        while crossings[j] and (crossings[j][1] <= n - horizon or crossings[j][3] < n) do
          j = j + 1
        end
        away = crossings[j] ~= nil and crossings[j][2] <= cut_polled
      end
      if away then
        gone[#gone + 1] = n
      elseif #admit < take then
        admit[#admit + 1] = n
        last_admitted = n
      end
      if #admit >= take and judged >= probe then
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
for c = 1, #gone, 1000 do
  redis.call('ZREM', KEYS[5], unpack(gone, c, math.min(c + 999, #gone)))
end
for c = 1, #admit, 1000 do
  redis.call('ZREM', KEYS[5], unpack(admit, c, math.min(c + 999, #admit)))
end
local nb = b
if last_admitted then
  nb = last_admitted + 1
  gb = departed_below(nb)
  redis.call('ZADD', KEYS[4], nb, nb .. ':' .. now .. ':' .. seq)
end
if nb ~= b or e ~= e0 then
  redis.call('HSET', KEYS[1], 'b', nb, 'e', e, 'gb', gb)
end
return {#admit, abandoned, active + #admit, waiting_from(nb, gb, seq), 0, suspended, nb}
