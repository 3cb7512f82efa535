-- show_view.lua: the show's seat states (after lapsing expired holds).
--
-- KEYS[1..4]  the show keys (see show_lib.lua); KEYS[5] the seat order list
-- ARGV[1]     now, ms
-- Returns     {event, kind, total, available, sold, {seat1, state1, seat2, state2, ...}}
sweep(ARGV[1])
local order = redis.call('LRANGE', KEYS[5], 0, -1)
local out = {}
if #order > 0 then
  local states = redis.call('HMGET', KEYS[2], unpack(order))
  for i, s in ipairs(order) do
    out[#out + 1] = s
    out[#out + 1] = states[i] or ''
  end
end
local info = redis.call('HMGET', KEYS[1], 'event', 'kind', 'total', 'available', 'sold')
return {info[1] or '', info[2] or '', tonumber(info[3] or '0'), tonumber(info[4] or '0'),
  tonumber(info[5] or '0'), out}
