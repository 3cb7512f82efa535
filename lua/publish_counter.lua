-- publish_counter.lua: the admission leader's global_counter figures, published each tick, and
-- the gaps they make obsolete dropped in the same step.
--
-- KEYS[1]  the event's live-figures hash
-- KEYS[2]  the event's counter gaps (zset: number → number, lua/gap.lua)
-- ARGV[1]  the counter range the figures describe (its first number)
-- ARGV[2]  people waiting from before the range
-- ARGV[3]  the first number still waiting ('' when nobody numbered waits)
-- ARGV[4..] numbers of places the tick's read removed as abandoned (lua/shard_heads.lua)
-- Returns  how many of those were recorded as gaps (the rest were behind the first number)
--
-- One script, so a poll never reads half of an update, and never a first number beside gaps
-- already behind it. With nobody numbered waiting the gaps stay: someone may be about to join
-- with a number below them. A place removed as abandoned was among the first of its shard, not
-- always the first of the line: its number is a gap for everyone behind it, recorded here in the
-- same step as the figures that no longer count it, so gap.lua's invariant holds (every gap at
-- or after the published first number).
redis.call('HSET', KEYS[1], 'gc_start', ARGV[1], 'gc_carried', ARGV[2], 'gc_first', ARGV[3])
local first = tonumber(ARGV[3])
if first then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[3])
end
local recorded = 0
for i = 4, #ARGV do
  if not first or tonumber(ARGV[i]) > first then
    redis.call('ZADD', KEYS[2], ARGV[i], ARGV[i])
    recorded = recorded + 1
  end
end
return recorded
