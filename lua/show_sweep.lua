-- show_sweep.lua: lapse expired holds of one show now (the admission leader runs it about once
-- a second, so seats come back and a sold-out line reopens without waiting for a reader).
--
-- KEYS[1..4]  the show keys (see show_lib.lua)
-- ARGV[1]     now, ms
-- Returns     {places freed, available}
local freed = sweep(ARGV[1])
return {freed, available()}
