-- next_numbers.lua: the next arrival numbers of an event's global_counter range, for a batch
-- of enters, with the figures their positions need (src/queue/counted.rs).
--
-- KEYS[1]  the event's counter
-- KEYS[2]  the event's live-figures hash (gc_start, gc_carried, gc_first: lua/publish_counter.lua)
-- KEYS[3]  the event's counter gaps (zset: number → number; lua/gap.lua)
-- ARGV[1]  the range's first score minus one (the counter never hands out less than ARGV[1] + 1)
-- ARGV[2]  how many numbers (k ≥ 1)
-- Returns  {top, gc_start, gc_carried, gc_first, gaps}: the numbers are top − k + 1 … top; the
--          figures as stored ('' when missing); gaps, the recorded gaps below the first number
--
-- An INCRBY, except that a counter below the range (never set, or lost with a failed primary) is
-- lifted to the range first, so a new arrival can never jump ahead of the line.
--
-- The gaps below the first number are the gaps below each of the k: a gap is a number already
-- handed out (lua/gap.lua), and none of the k had been until now. So one read serves every
-- position of the batch, as each enter's own read did before.
local k = tonumber(ARGV[2])
local floor = tonumber(ARGV[1])
local top = redis.call('INCRBY', KEYS[1], k)
if top - k < floor then
  top = floor + k
  redis.call('SET', KEYS[1], string.format('%.0f', top))
end
local f = redis.call('HMGET', KEYS[2], 'gc_start', 'gc_carried', 'gc_first')
-- '%.0f': numbers are µs since the epoch, beyond the 14 digits Lua's tostring keeps.
local gaps = redis.call('ZCOUNT', KEYS[3], '-inf', '(' .. string.format('%.0f', top - k + 1))
return {top, f[1] or '', f[2] or '', f[3] or '', gaps}
