-- nl_snapshot.lua: the figures a service instance needs to compute waiting positions itself
-- for a short while (src/queue/snapshot.rs): a poll far from the front then costs no command.
-- Keys: see lua/numbered_lib.lua (prepended).
--
-- Returns {b, gb, t, m, counter, k0, he, p(k0), bytes(k0), p(k0 + 1), bytes(k0 + 1), …, p(m),
-- bytes(m)} where k0 is the block of the boundary b, he the furthest edge of the horizon a tick
-- used (`horizon_edge` in lua/numbered_lib.lua), p(k) the departures before block k and
-- bytes(k) the block's departure bits (BLOCK / 8 bytes, fewer at the bitmap's end), '' for a
-- block with no departure. Blocks after m hold no departure: there, the departures below n are t.
--
-- ARGV (none on a first read): what the instance holds from its last read, so that a block it
-- holds unchanged is not sent again: ARGV[1] the counter and ARGV[2] t as read then, ARGV[3]
-- the first block held, ARGV[4…] the departures in each block held from it on. A departure
-- bit is only ever set, never cleared, so a block with as many departures as the copy held
-- holds the same ones: its bytes(k) is then false (a nil reply), "keep yours". Only while
-- neither the counter nor t went back (a line that began again is read whole).
local f = redis.call('HMGET', KEYS[1], 'b', 'gb', 't', 'm', 'he')
local b, gb = tonumber(f[1]) or 1, tonumber(f[2]) or 0
local t, m = tonumber(f[3]) or 0, tonumber(f[4]) or -1
local he = tonumber(f[5]) or 0
local seq = tonumber(redis.call('GET', KEYS[6])) or 0
local held = {}
if #ARGV >= 3 and seq >= tonumber(ARGV[1]) and t >= tonumber(ARGV[2]) then
  local first = tonumber(ARGV[3])
  for i = 4, #ARGV do
    held[first + i - 4] = tonumber(ARGV[i])
  end
end
local k0 = math.floor(b / BLOCK)
local out = {b, gb, t, m, seq, k0, he}
if k0 > m then
  return out
end
local fields = {}
for k = k0, m do
  fields[#fields + 1] = 'p' .. k
end
local p = redis.call('HMGET', KEYS[1], unpack(fields))
for k = k0, m do
  local here = tonumber(p[k - k0 + 1]) or 0
  local after = t
  if k < m then
    after = tonumber(p[k - k0 + 2]) or 0
  end
  out[#out + 1] = here
  if after > here and held[k] == after - here then
    out[#out + 1] = false
  elseif after > here then
    out[#out + 1] = redis.call('GETRANGE', KEYS[2], k * BLOCK / 8, (k + 1) * BLOCK / 8 - 1)
  else
    out[#out + 1] = ''
  end
end
return out
