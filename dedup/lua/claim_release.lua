-- Release a tumbling claim: delete the key if it still holds the claim's
-- token (bytes 2..5 of a record).
-- KEYS[1] key; ARGV[1] token (4 bytes)
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 2, 5) == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0
