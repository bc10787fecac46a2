-- Release an accepted sliding/session claim: forget the ping in its seen
-- set, and if it is still the asset's last accepted ping, put the track back
-- as it was before it (trackState.undo in Go). Only the claim's own token
-- acts.
-- KEYS[1] track, KEYS[2] seen set; ARGV[1] seen field, ARGV[2] token (8 bytes)
local CORE = '>dddi8i8i8i8ddi8c8i8ddi8c8Bi8c8dddi8i8dddi8i8dddi8i8d' -- as in track_decide.lua
local CORE_SIZE = 273

local released = 0
local v = redis.call('HGET', KEYS[2], ARGV[1])
if v and string.sub(v, 1, 1) ~= 's' and string.sub(v, 2, 9) == ARGV[2] then
	redis.call('HDEL', KEYS[2], ARGV[1])
	released = 1
end
local st = redis.call('GET', KEYS[1])
if not st then
	return released
end
local fields = { struct.unpack(CORE, st, 9) }
if fields[16] == ARGV[2] then -- the last accepted ping's token
	if string.byte(st, 9 + CORE_SIZE) == 1 then
		local prev = string.sub(st, 10 + CORE_SIZE, 9 + 2 * CORE_SIZE)
		redis.call('SET', KEYS[1], string.sub(st, 1, 8) .. prev .. '\0', 'KEEPTTL')
	else
		redis.call('DEL', KEYS[1])
	end
end
return released
