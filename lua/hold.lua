-- hold.lua: hold seats all or nothing, or a general-admission quantity.
--
-- KEYS[1..4]  the show keys (see show_lib.lua)
-- ARGV[1]     hold id
-- ARGV[2]     ticket
-- ARGV[3]     now, ms
-- ARGV[4]     hold length, ms
-- ARGV[5]     quantity ('' for a seated show)
-- ARGV[6..]   seat ids (seated)
-- Returns     {1, available}                  held
--             {0, taken seat ids...}          a seat is held or sold: nothing held
--             {-1, unknown seat ids...}       no such seat: nothing held
--             {-2, available}                 general admission: fewer than asked remain
--             {-3}                            wrong kind of request for this show
sweep(ARGV[3])
local kind = redis.call('HGET', KEYS[1], 'kind')
local expires = tonumber(ARGV[3]) + tonumber(ARGV[4])
local rec
if kind == 'ga' then
  if ARGV[5] == '' then return {-3} end
  local q = tonumber(ARGV[5])
  if available() < q then return {-2, available()} end
  redis.call('HINCRBY', KEYS[1], 'available', -q)
  rec = {ticket = ARGV[2], quantity = q, expires = expires}
else
  if ARGV[5] ~= '' then return {-3} end
  local taken, unknown = {}, {}
  for i = 6, #ARGV do
    local st = redis.call('HGET', KEYS[2], ARGV[i])
    if not st then
      unknown[#unknown + 1] = ARGV[i]
    elseif st ~= '' then
      taken[#taken + 1] = ARGV[i]
    end
  end
  if #unknown > 0 then return {-1, unpack(unknown)} end
  if #taken > 0 then return {0, unpack(taken)} end
  local seats = {}
  for i = 6, #ARGV do
    redis.call('HSET', KEYS[2], ARGV[i], 'h:' .. ARGV[1])
    seats[#seats + 1] = ARGV[i]
  end
  redis.call('HINCRBY', KEYS[1], 'available', -#seats)
  rec = {ticket = ARGV[2], seats = seats, expires = expires}
end
redis.call('HSET', KEYS[4], ARGV[1], cjson.encode(rec))
redis.call('ZADD', KEYS[3], expires, ARGV[1])
return {1, available()}
