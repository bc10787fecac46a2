-- Settle a tumbling claim: replace the value with its settled encoding, if
-- the key still holds the claim's token (bytes 2..5 of a record).
-- KEYS[1] key; ARGV[1] the settled record
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 2, 5) == string.sub(ARGV[1], 2, 5) then
	redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
	return 1
end
return 0
