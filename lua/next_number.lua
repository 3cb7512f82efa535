-- next_number.lua: the next arrival number of an event's global_counter range.
--
-- KEYS[1]  the event's counter
-- ARGV[1]  the range's first score minus one (the counter never hands out less than ARGV[1] + 1)
-- Returns  the number
--
-- A plain INCR, except that a counter below the range (never set, or lost with a failed
-- primary) is lifted to the range first, so a new arrival can never jump ahead of the line.
local v = redis.call('INCR', KEYS[1])
local floor = tonumber(ARGV[1])
if v <= floor then
  v = floor + 1
  redis.call('SET', KEYS[1], v)
end
return v
