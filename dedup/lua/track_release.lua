-- Release an accepted sliding/session claim: forget the ping in its seen
-- set, and if it is still the asset's last accepted ping, restore the one
-- before it (trackState.undo in Go). Only the claim's own token acts.
-- KEYS[1] state, KEYS[2] seen set; ARGV[1] seen field, ARGV[2] token (8 bytes)
local released = 0
local v = redis.call('HGET', KEYS[2], ARGV[1])
if v and string.sub(v, 1, 1) ~= 's' and string.sub(v, 2, 9) == ARGV[2] then
	redis.call('HDEL', KEYS[2], ARGV[1])
	released = 1
end
local st = redis.call('GET', KEYS[1])
if st and string.sub(st, 42, 49) == ARGV[2] then -- the last point's token
	if string.byte(st, 1) == 1 then
		local seenMax, _, prevSessionStart = struct.unpack('>i8i8i8', st, 98)
		redis.call('SET', KEYS[1],
			string.char(0) .. string.sub(st, 50, 97) .. string.rep('\0', 48) ..
			struct.pack('>i8i8i8', seenMax, prevSessionStart, 0),
			'KEEPTTL')
	else
		redis.call('DEL', KEYS[1])
	end
end
return released
