-- Settle an accepted sliding/session claim: its seen value goes from
-- pending to settled, if it still carries the claim's token.
-- KEYS[1] seen set; ARGV[1] seen field, ARGV[2] token (8 bytes)
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and string.sub(v, 1, 1) == 'p' and string.sub(v, 2, 9) == ARGV[2] then
	redis.call('HSET', KEYS[1], ARGV[1], 'a' .. string.sub(v, 2))
end
return 0
