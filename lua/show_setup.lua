-- show_setup.lua: create a show's seat map (once; a repeat with the same show is a no-op).
--
-- KEYS[1..4]  the show keys (see show_lib.lua); KEYS[5] the seat order list
-- ARGV[1]     event id
-- ARGV[2]     'seated' or 'ga'
-- ARGV[3]     total places
-- ARGV[4..]   seat ids, in display order (seated only)
-- Returns     {1, total} when created, {0, event of the existing show} when it existed
local existing = redis.call('HGET', KEYS[1], 'event')
if existing then
  return {0, existing}
end
redis.call('HSET', KEYS[1], 'event', ARGV[1], 'kind', ARGV[2], 'total', ARGV[3],
  'available', ARGV[3], 'sold', 0)
for i = 4, #ARGV do
  redis.call('HSET', KEYS[2], ARGV[i], '')
  redis.call('RPUSH', KEYS[5], ARGV[i])
end
return {1, tonumber(ARGV[3])}
