-- publish_counter.lua: the admission leader's global_counter figures, published each tick, and
-- the gaps they make obsolete dropped in the same step.
--
-- KEYS[1]  the event's live-figures hash
-- KEYS[2]  the event's counter gaps (zset: number → number, lua/gap.lua)
-- ARGV[1]  the counter range the figures describe (its first number)
-- ARGV[2]  people waiting from before the range
-- ARGV[3]  the first number still waiting ('' when nobody numbered waits)
--
-- One script, so a poll never reads half of an update, and never a first number beside gaps
-- already behind it. With nobody numbered waiting the gaps stay: someone may be about to join
-- with a number below them.
redis.call('HSET', KEYS[1], 'gc_start', ARGV[1], 'gc_carried', ARGV[2], 'gc_first', ARGV[3])
if ARGV[3] ~= '' then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[3])
end
return 1
