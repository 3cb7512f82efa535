-- admit.lua: move the first members of one shard's waiting line into its active set.
--
-- KEYS[1]  waiting zset of the shard
-- KEYS[2]  active zset of the shard
-- KEYS[3]  admitted-total counter of the shard
-- KEYS[4]  last-seen zset of the shard
-- KEYS[5]  the shard's last operation id (string)
-- KEYS[6]  the shard's crossings of its horizon (zset, see lua/line_lib.lua)
-- ARGV[1]  at most this many
-- ARGV[2]  score of the last member the scheduler chose in this shard ('' = no bound: the
--          first ARGV[1] members, as round-robin admission asks)
-- ARGV[3]  that member
-- ARGV[4]  now, ms (the active set's score: admission time)
-- ARGV[5]  abandon bound for people who have polled (or came inside the horizon without a record
--          since, see lua/line_lib.lua), ms: last seen at or before it, they are
--          removed, not admitted (the longer bound while the overload guard holds)
-- ARGV[6]  abandon bound for entries that never polled (negative last-seen, see enter.lua)
-- ARGV[7]  fence: admit nobody once this node's clock (TIME, ms) reaches it ('' = no fence).
--          The scheduler passes its lease's lapse minus a margin for clock differences
--          between nodes (src/queue/admission.rs), so a leader whose tick outlived its lease
--          cannot admit beside its successor.
-- ARGV[8]  this operation's id ('' = none): a second run with the same id (a client retry
--          after an I/O error, when the first run went through) changes nothing
-- Returns  {admitted members in order, number of abandoned places removed, status}: status 0
--          done, 1 refused by the fence, 2 this operation already ran
--
-- Only members at or before (ARGV[2], ARGV[3]) move: if someone ahead left after the scheduler
-- read the heads, this admits fewer rather than someone further back, so global order holds.
-- The move and the counter are one atomic step: nobody is admitted twice or uncounted.
if ARGV[8] ~= '' and redis.call('GET', KEYS[5]) == ARGV[8] then
  return {{}, 0, 2}
end
if ARGV[7] ~= '' then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) >= tonumber(ARGV[7]) then
    return {{}, 0, 1}
  end
end
local n = tonumber(ARGV[1])
local bounded = ARGV[2] ~= ''
local last_score = tonumber(ARGV[2])
local cut_polled = tonumber(ARGV[5])
local cut_entered = tonumber(ARGV[6])
local heads = redis.call('ZRANGE', KEYS[1], 0, n - 1, 'WITHSCORES')
-- The qualifying prefix of the heads.
local members, scores = {}, {}
for i = 1, #heads, 2 do
  local member, score = heads[i], tonumber(heads[i + 1])
  if not bounded or score < last_score or (score == last_score and member <= ARGV[3]) then
    members[#members + 1] = member
    scores[#scores + 1] = heads[i + 1]
  else
    break
  end
end
-- Every precondition before the first write (Redis keeps a failed script's earlier writes): the
-- other keys hold their types, so no one leaves the line without reaching the active set.
local want = {[2] = 'zset', [3] = 'string', [4] = 'zset', [5] = 'string', [6] = 'zset'}
for i, ty in pairs(want) do
  local found = redis.call('TYPE', KEYS[i])['ok']
  if found ~= 'none' and found ~= ty then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' holds a ' .. found)
  end
end
if ARGV[8] ~= '' then
  redis.call('SET', KEYS[5], ARGV[8], 'PX', 600000)
end
if #members == 0 then
  return {{}, 0, 0}
end
-- They are the first #members of the line: one range removal. The rest goes in variadic calls
-- over chunks: one redis.call costs microseconds whatever it carries, and a call per person
-- made admitting 5,000 take ~50 ms of Redis time (docs/benchmarks.md).
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #members - 1)
local CHUNK = 1000
local admitted = {}
local abandoned = 0
for c = 1, #members, CHUNK do
  local last = math.min(c + CHUNK - 1, #members)
  local chunk = {unpack(members, c, last)}
  -- abandoned_flags(): lua/line_lib.lua, prepended when the script is loaded.
  local flags = abandoned_flags(KEYS[4], KEYS[6], chunk, {unpack(scores, c, last)}, cut_polled,
                                cut_entered)
  redis.call('ZREM', KEYS[4], unpack(chunk))
  local add = {}
  for i = c, last do
    if flags[i - c + 1] then
      abandoned = abandoned + 1
    else
      admitted[#admitted + 1] = members[i]
      add[#add + 1] = ARGV[4]
      add[#add + 1] = members[i]
    end
  end
  if #add > 0 then
    redis.call('ZADD', KEYS[2], unpack(add))
  end
end
if #admitted > 0 then
  redis.call('INCRBY', KEYS[3], #admitted)
end
return {admitted, abandoned, 0}
