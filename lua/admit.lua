-- admit.lua: move the first members of one shard's waiting line into its active set.
--
-- KEYS[1]  waiting zset of the shard
-- KEYS[2]  active zset of the shard
-- KEYS[3]  admitted-total counter of the shard
-- KEYS[4]  last-seen zset of the shard
-- ARGV[1]  at most this many
-- ARGV[2]  score of the last member the scheduler chose in this shard ('' = no bound: the
--          first ARGV[1] members, as round-robin admission asks)
-- ARGV[3]  that member
-- ARGV[4]  now, ms (the active set's score: admission time)
-- ARGV[5]  abandon bound, ms: people last seen at or before it are removed, not admitted
-- Returns  {admitted members in order, number of abandoned places removed}
--
-- Only members at or before (ARGV[2], ARGV[3]) move: if someone ahead left after the scheduler
-- read the heads, this admits fewer rather than someone further back, so global order holds.
-- The move and the counter are one atomic step: nobody is admitted twice or uncounted.
local n = tonumber(ARGV[1])
local bounded = ARGV[2] ~= ''
local last_score = tonumber(ARGV[2])
local cutoff = tonumber(ARGV[5])
local heads = redis.call('ZRANGE', KEYS[1], 0, n - 1, 'WITHSCORES')
local admitted = {}
local abandoned = 0
for i = 1, #heads, 2 do
  local member, score = heads[i], tonumber(heads[i + 1])
  if not bounded or score < last_score or (score == last_score and member <= ARGV[3]) then
    local seen = redis.call('ZSCORE', KEYS[4], member)
    redis.call('ZREM', KEYS[1], member)
    redis.call('ZREM', KEYS[4], member)
    if seen and tonumber(seen) <= cutoff then
      abandoned = abandoned + 1
    else
      redis.call('ZADD', KEYS[2], ARGV[4], member)
      admitted[#admitted + 1] = member
    end
  else
    break
  end
end
if #admitted > 0 then
  redis.call('INCRBY', KEYS[3], #admitted)
end
return {admitted, abandoned}
