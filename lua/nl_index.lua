-- nl_index.lua: a person's entry in the numbered line's index (a small hash bucket, kept
-- listpack-encoded: see docs/numbered-line.md).
--
-- KEYS[1]  the index bucket of the person's member
-- ARGV[1]  the member
-- ARGV[2]  the number to write
-- ARGV[3]  '' : write ARGV[2] only when the member has no number (an enter);
--          a number: write ARGV[2] only when the member's number is this one (a re-entry whose
--          old place is gone; another enter may have written in between)
-- Returns  the member's number after the call
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (ARGV[3] == '' and not cur) or (ARGV[3] ~= '' and cur == ARGV[3]) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return tonumber(ARGV[2])
end
return tonumber(cur)
