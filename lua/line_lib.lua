-- line_lib.lua: shared prelude of the admission's line scripts, shard_heads.lua and admit.lua
-- (prepended when the scripts are loaded; see src/redis/scripts.rs).
--
-- A person has a last-seen record only inside their shard's horizon (see shard_heads.lua): a
-- positive one once they polled there, a negative one (-now, "never polled") when they entered
-- there. Someone without a record who came inside as the line moved is covered by the shard's
-- crossings: a sorted set with one entry per tick that moved the horizon, scored by the line
-- score of the last person then inside, its member '<tick time, ms>:<that score>'. They came
-- inside at the time of the first crossing at or above their score.

-- When each of `scores` (strings, ascending) came inside: the time (ms) of the first crossing at
-- or above it, or false when none covers it yet.
local function inside_since(crossings, scores)
  local out = {}
  if #scores == 0 then
    return out
  end
  local c = redis.call('ZRANGEBYSCORE', crossings, scores[1], scores[#scores], 'WITHSCORES')
  local after = redis.call('ZRANGEBYSCORE', crossings, '(' .. scores[#scores], '+inf',
                           'WITHSCORES', 'LIMIT', 0, 1)
  for i = 1, #after do
    c[#c + 1] = after[i]
  end
  -- Each crossing parsed once (a few per tick's worth of people), not once per person.
  local at, time = {}, {}
  for j = 1, #c, 2 do
    at[#at + 1] = tonumber(c[j + 1])
    time[#time + 1] = tonumber(string.match(c[j], '^(%d+)'))
  end
  local j = 1
  for i = 1, #scores do
    local score = tonumber(scores[i])
    while at[j] and at[j] < score do
      j = j + 1
    end
    out[i] = time[j] or false
  end
  return out
end

-- Which of `members` (a run of the line in order, with their `scores`) have left without saying
-- so: a table of booleans by index. Someone who polled (a positive record) or came inside
-- without a record since (who may have polled further back, where nothing is recorded) is held
-- to `cut_polled`, the guard's longer bound while it holds; an entry recorded at its enter that
-- never polled (a negative record) to `cut_entered`. Someone with neither a record nor a
-- crossing is not inside yet and never taken for gone.
local function abandoned_flags(seen_key, crossings, members, scores, cut_polled, cut_entered)
  local seen = redis.call('ZMSCORE', seen_key, unpack(members))
  local unseen = {}
  for i = 1, #members do
    if not seen[i] then
      unseen[#unseen + 1] = scores[i]
    end
  end
  local since = inside_since(crossings, unseen)
  local flags, u = {}, 0
  for i = 1, #members do
    local s = seen[i] and tonumber(seen[i])
    if s and s > 0 then
      flags[i] = s <= cut_polled
    elseif s then
      flags[i] = -s <= cut_entered
    else
      u = u + 1
      flags[i] = since[u] and since[u] <= cut_polled or false
    end
  end
  return flags
end
