-- Sliding and session decision: judgeTrack (track.go) in Lua, one atomic
-- round trip. A property test holds the two to identical verdicts.
--
-- KEYS[1]  the asset's state
-- KEYS[2]  the seen set of the ping's minute
-- ARGV[1]  the ping as a point (48 bytes, POINT below)
-- ARGV[2]  the ping's seen field: device time ns, lat, lon (24 bytes)
-- ARGV[3]  server time, ms          ARGV[4]  TTL, ms
-- ARGV[5]  shape: sliding | session ARGV[6]  window, µs
-- ARGV[7]  session idle, µs         ARGV[8]  hysteresis, m (0: off)
-- ARGV[9]  in-flight timeout, ms
--
-- State: flags (1 byte, 1 = has prev), last point, prev point,
-- then seen max, session start, prev session start (µs, i8 each): 121 bytes.
-- Seen value: 's' (suppressed), or 'p' (pending) / 'a' (settled) + token
-- (8 bytes) + claim time ms (i8).

local POINT = '>i8ddc8i8c8' -- device time µs, lat, lon, cell, bucket, token
local EARTH_RADIUS_M = 6371007.180918475

local now, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])

local seen = redis.call('HGET', KEYS[2], ARGV[2])
if seen then
	if string.sub(seen, 1, 1) == 'p' and now - struct.unpack('>i8', seen, 10) < tonumber(ARGV[9]) then
		return { 'in_flight', 'redelivery' }
	end
	return { 'suppressed', 'redelivery' }
end

local function distance(lat1, lon1, lat2, lon2)
	local rad = math.pi / 180
	local sinLat = math.sin((lat2 - lat1) * rad / 2)
	local sinLon = math.sin((lon2 - lon1) * rad / 2)
	local a = sinLat * sinLat + math.cos(lat1 * rad) * math.cos(lat2 * rad) * sinLon * sinLon
	return 2 * EARTH_RADIUS_M * math.asin(math.sqrt(a))
end

local function record(value)
	redis.call('HSET', KEYS[2], ARGV[2], value)
	redis.call('PEXPIRE', KEYS[2], ttl)
end

local function store(flags, last, prev, seenMax, sessionStart, prevSessionStart)
	redis.call('SET', KEYS[1],
		string.char(flags) .. last .. prev .. struct.pack('>i8i8i8', seenMax, sessionStart, prevSessionStart),
		'PX', ttl)
end

local ping = ARGV[1]
local t, lat, lon, cell, bucket, token = struct.unpack(POINT, ping)
local pending = 'p' .. token .. struct.pack('>i8', now)

local st = redis.call('GET', KEYS[1])
if not st then
	store(0, ping, string.rep('\0', 48), t, t, 0)
	record(pending)
	return { 'accepted', '' }
end

local flags = string.byte(st, 1)
local last, prev = string.sub(st, 2, 49), string.sub(st, 50, 97)
local lastT, lastLat, lastLon, lastCell, lastBucket = struct.unpack(POINT, last)
local seenMax, sessionStart, prevSessionStart = struct.unpack('>i8i8i8', st, 98)

local shape = ARGV[5]
local newSession = shape == 'session' and t - seenMax > tonumber(ARGV[7])
local hysteresis = tonumber(ARGV[8])
local suppress = false
if cell == lastCell or (hysteresis > 0 and distance(lat, lon, lastLat, lastLon) <= hysteresis) then
	if shape == 'sliding' then
		suppress = math.abs(t - lastT) < tonumber(ARGV[6])
	else
		suppress = (not newSession) and t >= sessionStart
	end
end

seenMax = math.max(seenMax, t)
if suppress then
	store(flags, last, prev, seenMax, sessionStart, prevSessionStart)
	record('s')
	if bucket ~= lastBucket then
		return { 'suppressed', shape }
	elseif lat == lastLat and lon == lastLon then
		return { 'suppressed', 'reobservation' }
	end
	return { 'suppressed', 'jitter' }
end

if t >= lastT then
	local newStart = sessionStart
	if newSession then
		newStart = t
	end
	store(1, ping, last, seenMax, newStart, sessionStart)
else
	store(flags, last, prev, seenMax, sessionStart, prevSessionStart)
end
record(pending)
return { 'accepted', '' }
