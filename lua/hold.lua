-- hold.lua: hold seats all or nothing, or a general-admission quantity.
--
-- KEYS[1..4]  the show keys (see show_lib.lua)
-- ARGV[1]     hold id
-- ARGV[2]     ticket
-- ARGV[3]     now, ms
-- ARGV[4]     hold length, ms (already cut to the end of the ticket's active session)
-- ARGV[5]     quantity ('' for a seated show)
-- ARGV[6]     most seats one ticket may hold and book in this show, all holds together
-- ARGV[7..]   seat ids (seated)
-- Returns     {1, available}                  held
--             {0, taken seat ids...}          a seat is held or sold: nothing held
--             {-1, unknown seat ids...}       no such seat: nothing held
--             {-2, available}                 general admission: fewer than asked remain
--             {-3}                            wrong kind of request for this show
--             {-4, hold id}                   the ticket already has a live hold here
--             {-5, seats it may still take}   over the ticket's cap: nothing held
--
-- Per ticket, the holdrec hash also keeps `live:<ticket>` (its last hold) and
-- `taken:<ticket>` (seats it booked; book.lua and unbook.lua keep it), so one admitted ticket
-- cannot hoard a show: one live hold at a time, and a cap on what it takes in all.
-- Every check comes before the first write: a refusal changes nothing.
sweep(ARGV[3])
-- Run twice (a client retry after the first run's answer was lost): the same hold, no second one.
local again = redis.call('HGET', KEYS[4], ARGV[1])
if again and cjson.decode(again).ticket == ARGV[2] then return {1, available()} end
local kind = redis.call('HGET', KEYS[1], 'kind')
local expires = tonumber(ARGV[3]) + tonumber(ARGV[4])
local live = redis.call('HGET', KEYS[4], 'live:' .. ARGV[2])
if live then
  local lraw = redis.call('HGET', KEYS[4], live)
  if lraw and not cjson.decode(lraw).booking then return {-4, live} end
end
if (kind == 'ga') == (ARGV[5] == '') then return {-3} end
local cap = tonumber(ARGV[6])
local taken_before = tonumber(redis.call('HGET', KEYS[4], 'taken:' .. ARGV[2]) or '0')
local wanted = #ARGV - 6
if kind == 'ga' then wanted = tonumber(ARGV[5]) end
if taken_before + wanted > cap then return {-5, math.max(cap - taken_before, 0)} end
local rec
if kind == 'ga' then
  local q = tonumber(ARGV[5])
  if available() < q then return {-2, available()} end
  redis.call('HINCRBY', KEYS[1], 'available', -q)
  rec = {ticket = ARGV[2], quantity = q, expires = expires}
else
  local taken, unknown = {}, {}
  for i = 7, #ARGV do
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
  for i = 7, #ARGV do
    redis.call('HSET', KEYS[2], ARGV[i], 'h:' .. ARGV[1])
    seats[#seats + 1] = ARGV[i]
  end
  redis.call('HINCRBY', KEYS[1], 'available', -#seats)
  rec = {ticket = ARGV[2], seats = seats, expires = expires}
end
redis.call('HSET', KEYS[4], ARGV[1], cjson.encode(rec), 'live:' .. ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], expires, ARGV[1])
return {1, available()}
