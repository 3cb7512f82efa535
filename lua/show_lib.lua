-- show_lib.lua: shared prelude of every show script (prepended when the scripts are loaded;
-- see src/redis/scripts.rs). It defines sweep(), which makes holds lapse by themselves.
--
-- Every show script receives the same first four keys, all under the show's hash tag:
--   KEYS[1]  info     hash: event, kind ('seated' | 'ga'), total, available, sold
--   KEYS[2]  seats    hash: seat id -> '' (available) | 'h:<hold id>' | 's:<booking id>'
--   KEYS[3]  holds    zset: hold id -> expiry, ms (only holds not yet booked)
--   KEYS[4]  holdrec  hash: hold id -> JSON {ticket, seats | quantity, expires, booking?}
--
-- A hold has SET NX EX semantics: it takes seats only when they are free, and it lapses at its
-- expiry. The lapse happens in sweep(), which every show script runs first (and the admission
-- leader runs about once a second), so no reader ever sees a hold past its expiry.

local function sweep(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  local freed = 0
  for _, id in ipairs(expired) do
    local raw = redis.call('HGET', KEYS[4], id)
    if raw then
      local h = cjson.decode(raw)
      if h.seats then
        for _, s in ipairs(h.seats) do
          if redis.call('HGET', KEYS[2], s) == 'h:' .. id then
            redis.call('HSET', KEYS[2], s, '')
            freed = freed + 1
          end
        end
      else
        freed = freed + h.quantity
      end
      redis.call('HDEL', KEYS[4], id)
    end
    redis.call('ZREM', KEYS[3], id)
  end
  if freed > 0 then
    redis.call('HINCRBY', KEYS[1], 'available', freed)
  end
  return freed
end

local function available()
  return tonumber(redis.call('HGET', KEYS[1], 'available') or '0')
end
