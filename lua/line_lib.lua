-- line_lib.lua: shared prelude of the admission's line scripts, shard_heads.lua and admit.lua
-- (prepended when the scripts are loaded; see src/redis/scripts.rs).

-- Whether the last-seen score `s` lies at or before its abandon bound. Someone who polled
-- (positive) or was stamped inside the horizon (negative with a half: they may have polled
-- further back, where nothing is recorded; see shard_heads.lua) is held to `cut_polled`, the
-- guard's longer bound while it holds; an entry recorded at its enter that never polled (a
-- negative whole number, see enter.lua) to `cut_entered`.
local function is_gone(s, cut_polled, cut_entered)
  if s > 0 then
    return s <= cut_polled
  end
  if (-s) % 1 ~= 0 then
    return -s - 0.5 <= cut_polled
  end
  return -s <= cut_entered
end
