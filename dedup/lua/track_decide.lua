-- Sliding and session decision: judgeTrack (track.go) in Lua, one atomic
-- round trip. A property test holds the two to identical verdicts; every
-- number a transcendental function gives comes from Go, in ARGV[1].
--
-- KEYS[1]  the asset's track
-- KEYS[2]  the seen set of the ping's minute
-- ARGV[1]  the fix (FIX below)
-- ARGV[2]  the ping's seen field
-- ARGV[3]  server time, ms          ARGV[4]  TTL, ms
-- ARGV[5]  shape: sliding | session ARGV[6]  window, µs
-- ARGV[7]  session idle, µs         ARGV[8]  in-flight timeout, ms
--
-- Track: seen max (i8), the current track (CORE), whether an undo record
-- follows (byte), and the track before the last acceptance (CORE).
-- Seen value: 's' (suppressed), or 'p' (pending) / 'a' (settled) + token
-- (8 bytes) + claim time ms (i8).

-- device time µs, lat, lon, bucket, token, metres per degree of longitude
-- and of latitude, accuracy m, moving, at rest, event, state print, radius m
local FIX = '>i8ddi8c8dddBBBc8d'
-- stay: anchor lat, lon, spread m², fixes, arrival µs, last fix µs; ref
-- point; last accepted point; flags (1 last is a candidate outside the
-- stay, 2 it could be an outlier); session start; state print
local CORE = '>dddi8i8i8' .. 'i8ddi8c8' .. 'i8ddi8c8' .. 'Bi8c8'
local NOSTATE = string.rep('\0', 8)

-- the constants of track.go
local LAG, OUTLIER, ACCEL, SPEED, MEMORY, SETTLED, NOISE2 = 1.5, 4, 4, 70, 64, 3, 10.24

local now, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local shape, window, idle = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])

local seen = redis.call('HGET', KEYS[2], ARGV[2])
if seen then
	if string.sub(seen, 1, 1) == 'p' and now - struct.unpack('>i8', seen, 10) < tonumber(ARGV[8]) then
		return { 'in_flight', 'redelivery' }
	end
	return { 'suppressed', 'redelivery' }
end

local t, lat, lon, bucket, token, kx, ky, acc, moving, atRest, event, statep, radius = struct.unpack(FIX, ARGV[1])
local fixpoint = { t = t, lat = lat, lon = lon, bucket = bucket, token = token }

local function decode(s, pos)
	local c = {}
	local rt, rlat, rlon, rb, rtok, ct, clat, clon, cb, ctok, flags
	c.alat, c.alon, c.spread2, c.n, c.startT, c.lastT, rt, rlat, rlon, rb, rtok, ct, clat, clon, cb, ctok, flags,
		c.sessionStart, c.state, pos = struct.unpack(CORE, s, pos)
	c.ref = { t = rt, lat = rlat, lon = rlon, bucket = rb, token = rtok }
	c.last = { t = ct, lat = clat, lon = clon, bucket = cb, token = ctok }
	c.hasCand, c.outlier = flags % 2 == 1, flags >= 2
	return c, pos
end

local function encode(c)
	local flags = 0
	if c.hasCand then flags = flags + 1 end
	if c.outlier then flags = flags + 2 end
	return struct.pack(CORE, c.alat, c.alon, c.spread2, c.n, c.startT, c.lastT,
		c.ref.t, c.ref.lat, c.ref.lon, c.ref.bucket, c.ref.token,
		c.last.t, c.last.lat, c.last.lon, c.last.bucket, c.last.token,
		flags, c.sessionStart, c.state)
end

local function dist2(plat, plon)
	local dy = (lat - plat) * ky
	local dx = (lon - plon) * kx
	return dx * dx + dy * dy
end

local function radius2(c)
	local lag = LAG * radius
	local r2 = math.min(NOISE2 * c.spread2, lag * lag)
	return math.max(r2, radius * radius, acc * acc)
end

local function lag2()
	local lag = math.max(LAG * radius, acc)
	return lag * lag
end

local function holds(c)
	local settled = c.n >= SETTLED
	if moving == 1 and settled then
		return false
	end
	if dist2(c.alat, c.alon) > radius2(c) then
		return false
	end
	return (atRest == 1 and settled) or dist2(c.last.lat, c.last.lon) <= lag2()
end

local function reach(c)
	local dt = (t - c.lastT) / 1e6
	return math.sqrt(radius2(c)) + math.min((0.5 * ACCEL) * (dt * dt), SPEED * dt)
end

local function outlierAtRest(c)
	if moving == 1 or c.n < SETTLED or dist2(c.last.lat, c.last.lon) > lag2() then
		return false
	end
	if atRest == 1 then
		return true
	end
	local r = reach(c)
	return dist2(c.alat, c.alon) > r * r
end

local function couldBeOutlier(c)
	local d2 = dist2(c.alat, c.alon)
	local far = OUTLIER * math.sqrt(radius2(c))
	local r = reach(c)
	return d2 <= far * far or d2 > r * r
end

local function settle(c)
	local d2 = dist2(c.alat, c.alon)
	c.n = math.min(c.n + 1, MEMORY)
	c.alat = c.alat + (lat - c.alat) / c.n
	c.alon = c.alon + (lon - c.alon) / c.n
	c.spread2 = c.spread2 + (d2 - c.spread2) / c.n
	c.lastT = math.max(c.lastT, t)
	c.hasCand = false
end

local function reason(c)
	if bucket ~= c.ref.bucket then
		return shape
	elseif lat == c.ref.lat and lon == c.ref.lon then
		return 'reobservation'
	end
	return 'jitter'
end

local raw = redis.call('GET', KEYS[1])
if not raw then
	local c = { alat = lat, alon = lon, spread2 = 0, n = 1, startT = t, lastT = t, ref = fixpoint, last = fixpoint,
		hasCand = false, outlier = false, sessionStart = t, state = statep }
	local zero = { t = 0, lat = 0, lon = 0, bucket = 0, token = NOSTATE }
	local empty = { alat = 0, alon = 0, spread2 = 0, n = 0, startT = 0, lastT = 0, ref = zero, last = zero,
		hasCand = false, outlier = false, sessionStart = 0, state = NOSTATE }
	redis.call('SET', KEYS[1], struct.pack('>i8', t) .. encode(c) .. string.char(0) .. encode(empty), 'PX', ttl)
	redis.call('HSET', KEYS[2], ARGV[2], 'p' .. token .. struct.pack('>i8', now))
	redis.call('PEXPIRE', KEYS[2], ttl)
	return { 'accepted', '' }
end

local oldSeenMax, pos = struct.unpack('>i8', raw)
local old = decode(raw, pos)
local cur, pos2 = decode(raw, pos)
local hasPrev = string.byte(raw, pos2) == 1
local prev = decode(raw, pos2 + 1)

local function accept(newSession, change)
	prev, hasPrev = old, true
	change(cur)
	cur.state = statep
	if newSession then
		cur.sessionStart = t
	end
end

local function judge()
	if t < cur.last.t then
		if event == 1 or statep ~= cur.state or t < cur.startT or cur.n < SETTLED or
			(shape == 'session' and t < cur.sessionStart) or not holds(cur) then
			return 'accepted', ''
		end
		return 'suppressed', reason(cur)
	end
	local newSession = shape == 'session' and t - oldSeenMax > idle
	local forced = event == 1 or statep ~= cur.state or newSession
	if holds(cur) then
		-- Back from an excursion too far to be an outlier: a real move.
		local returned = cur.hasCand and not cur.outlier
		settle(cur)
		if not forced and not returned and (shape ~= 'sliding' or t - cur.ref.t < window) then
			return 'suppressed', reason(cur)
		end
		accept(newSession, function(c) c.ref, c.last, c.hasCand = fixpoint, fixpoint, false end)
		return 'accepted', ''
	elseif cur.hasCand then
		-- The asset left for where the last accepted ping was: judge the
		-- fix there.
		cur.alat, cur.alon, cur.spread2, cur.n = cur.last.lat, cur.last.lon, 0, 1
		cur.startT, cur.lastT = cur.last.t, cur.last.t
		cur.ref, cur.hasCand = cur.last, false
		return judge()
	elseif not forced and outlierAtRest(cur) then
		return 'suppressed', reason(cur)
	end
	local outlier = couldBeOutlier(cur)
	accept(newSession, function(c) c.last, c.hasCand, c.outlier = fixpoint, true, outlier end)
	return 'accepted', ''
end

local decision, why = judge()
local prevFlag = 0
if hasPrev then prevFlag = 1 end
redis.call('SET', KEYS[1], struct.pack('>i8', math.max(oldSeenMax, t)) .. encode(cur) .. string.char(prevFlag) .. encode(prev), 'PX', ttl)
if decision == 'accepted' then
	redis.call('HSET', KEYS[2], ARGV[2], 'p' .. token .. struct.pack('>i8', now))
else
	redis.call('HSET', KEYS[2], ARGV[2], 's')
end
redis.call('PEXPIRE', KEYS[2], ttl)
return { decision, why }
