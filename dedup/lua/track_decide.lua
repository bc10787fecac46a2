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
-- Track: seen max (i8), the current track (CORE), what releasing its last
-- accepted ping does (byte, trackState.undo in Go: 0 delete it, the ping
-- began the track; 1 put back the track that follows; 2 keep it, a release
-- spent the record; 3 delete it, the ping's request began the track; 4
-- keep it, another request's acceptance came between two of its request's),
-- and
-- the track before the last acceptance's request (CORE), present only when
-- the byte is 1, followed by the seen max from before that request (i8;
-- absent from tracks written before it was added); then, only when a
-- release holds one or what follows is there, the latest device time it
-- forgot (i8, trackState.held in Go: negative until the released ping's
-- retry is accepted; 0 when none); then, only when the uncertainty of the
-- stay's last accepted ping is not the last accepted one's in the current
-- track or the undo record, that uncertainty (d, track.refAccuracy in Go)
-- of the current track and, with an undo record, of that. Absent, it is
-- the last accepted ping's. The last accepted ping's token names the
-- request the byte is about: a late acceptance's, which moves nothing else
-- of it, or, with 2, the release's that spent the record.
-- Seen value: 's' (suppressed), 'u' (suppressed after an acceptance of its
-- own request, flagUndoable in Go: a redelivery may fold it in again), 'r'
-- (accepted, and released with the track still holding it, flagReleased in
-- Go: its retry is accepted and changes nothing in the track), or
-- 'p' (pending) / 'a' (settled) + token (8 bytes) + claim time ms (i8) +
-- the time it reached Redis, Redis's clock, ms (i8; absent from values
-- written before it was added) + 'r' when it is an 'r' ping's retry, which
-- left the track as it was (retried in Go), else '-' + the in-flight
-- timeout of the request that made it, ms (i8; seenValue.wait in Go). The last
-- two are absent from values written before they were added, which had
-- the 'r' alone, and a pending one of those waits this call's timeout.
-- Answer: the decision and reason, and for a redelivery of a settled ping
-- its claim time (8 bytes), for a suppression flagged 'u' the 'u'.

-- device time µs, lat, lon, bucket, token, metres per degree of longitude
-- and of latitude, accuracy m, moving, at rest, still, event, copied (it
-- repeats a ping before it in its batch), state print, radius m
local FIX = '>i8ddi8c8dddBBBBBc8d'
-- stay: anchor lat, lon, spread m², fixes, arrival µs, last fix µs; ref
-- point; last accepted point; flags (1 last is a candidate outside the
-- stay, 2 it could be an outlier); the last accepted point's uncertainty,
-- m (where a session start, never read, was once kept: as a double, 0);
-- state print; the past
-- stays (PAST of them: lat, lon, radius², arrival µs, departure µs); the
-- squared distance of the farthest outlier the stay threw.
-- Written out rather than built by concatenation, which every call would
-- do again: Lua 5.1 folds no string constants.
local PAST = 3
local CORE = '>dddi8i8i8i8ddi8c8i8ddi8c8Bdc8dddi8i8dddi8i8dddi8i8d'
local CORE_SIZE = 273 -- struct.size(CORE)
-- where the last accepted ping's uncertainty starts in a CORE
local LAST_ACC_AT = 1 + struct.size('>dddi8i8i8i8ddi8c8i8ddi8c8B')
-- where the last accepted ping's token starts in a CORE
local LAST_TOKEN_AT = 1 + struct.size('>dddi8i8i8i8ddi8c8i8ddi8')

-- the constants of track.go
local LAG, OUTLIER, ACCEL, SPEED, MEMORY, SETTLED, NOISE2, MARGIN2, REST_MARGIN = 1.5, 4, 4, 70, 64, 3, 10.24, 1.5625, 50

local now, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local shape, window, idle = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])

-- Redis's own clock, ms: when a claim reached it, which is later than the
-- claim's time if a hung server ran it from its socket buffer on resuming.
local function redisMs()
	local tm = redis.call('TIME')
	return tm[1] * 1000 + math.floor(tm[2] / 1000)
end

-- A pending claim waits in_flight_timeout from its claim time and from the
-- time it reached Redis, each on its own clock: one that landed late is in
-- flight until its request's reconciler has released it, not settled.
local seen = redis.call('HGET', KEYS[2], ARGV[2])
if seen then
	-- A call go-redis sent again after losing the reply of one that ran
	-- (a reset connection, a failover) finds this claim's own entry: the
	-- token in the fix, its fifth field.
	if string.sub(seen, 1, 9) == 'p' .. string.sub(ARGV[1], 33, 40) then
		return { 'accepted', '' }
	end
	if string.sub(seen, 1, 1) == 'p' then
		local wait = tonumber(ARGV[8])
		if #seen >= 34 then
			wait = struct.unpack('>i8', seen, 27)
		end
		if now - struct.unpack('>i8', seen, 10) < wait or (#seen >= 25 and redisMs() - struct.unpack('>i8', seen, 18) < wait) then
			return { 'in_flight', 'redelivery' }
		end
	elseif string.sub(seen, 1, 1) == 'a' then
		-- settled for good: its claim time says how long a near cache may
		-- answer for it
		return { 'suppressed', 'redelivery', string.sub(seen, 10, 17) }
	end
	if seen ~= 'u' and seen ~= 'r' then
		return { 'suppressed', 'redelivery' }
	end
	-- 'u': judged again below if the track lost it (refold in track.go);
	-- 'r': accepted below
end

local t, lat, lon, bucket, token, kx, ky, acc, moving, atRest, still, event, copied, statep, radius = struct.unpack(FIX, ARGV[1])
local fixpoint = { t = t, lat = lat, lon = lon, bucket = bucket, token = token }

local function encode(c)
	local flags = 0
	if c.hasCand then flags = flags + 1 end
	if c.outlier then flags = flags + 2 end
	local p = c.past
	return struct.pack(CORE, c.alat, c.alon, c.spread2, c.n, c.startT, c.lastT,
		c.ref.t, c.ref.lat, c.ref.lon, c.ref.bucket, c.ref.token,
		c.last.t, c.last.lat, c.last.lon, c.last.bucket, c.last.token,
		flags, c.lastAcc, c.state,
		p[1].lat, p[1].lon, p[1].radius2, p[1].startT, p[1].endT,
		p[2].lat, p[2].lon, p[2].radius2, p[2].startT, p[2].endT,
		p[3].lat, p[3].lon, p[3].radius2, p[3].startT, p[3].endT, c.outlier2)
end

-- remember records the ping in its seen set: accepted, pending with its
-- token, times, retried mark ('r', else '-') and in-flight timeout; else
-- flag.
local function remember(decision, flag, retried)
	if decision == 'accepted' then
		redis.call('HSET', KEYS[2], ARGV[2], 'p' .. token .. struct.pack('>i8i8', now, redisMs()) .. (retried or '-') .. struct.pack('>i8', tonumber(ARGV[8])))
	else
		redis.call('HSET', KEYS[2], ARGV[2], flag)
	end
	-- Lengthened only: the set holds other pings of the minute, which a
	-- handler of a longer ttl on this prefix (a rolling deploy that
	-- lengthens the retry ladder) recorded; shortened to this call's, their
	-- redeliveries were admitted again within their own ttl. A set HSET
	-- just made has none (PTTL -1).
	if redis.call('PTTL', KEYS[2]) < ttl then
		redis.call('PEXPIRE', KEYS[2], ttl)
	end
end

-- An asset's first fix starts its track, with no undo record. This comes
-- before the functions that judge a fix against a track: Lua makes a
-- closure of each as the script reaches it, on every call.
local raw = redis.call('GET', KEYS[1])
if seen == 'r' and raw then
	-- the retry of a ping its release left in the track: accepted, and the
	-- track, which holds it already, is left as it is; the trailing 'r'
	-- (retried in Go) makes its release mark it 'r' again
	remember('accepted', nil, 'r')
	return { 'accepted', '' }
end
if not raw then
	if seen == 'u' then
		return { 'suppressed', 'redelivery' }
	end
	local none = { lat = 0, lon = 0, radius2 = 0, startT = 0, endT = 0 }
	local c = { alat = lat, alon = lon, spread2 = 0, outlier2 = 0, n = 1, startT = t, lastT = t, ref = fixpoint, last = fixpoint,
		hasCand = false, outlier = false, lastAcc = acc, refAcc = acc, state = statep, past = { none, none, none } }
	redis.call('SET', KEYS[1], struct.pack('>i8', t) .. encode(c) .. '\0', 'PX', ttl)
	remember('accepted')
	return { 'accepted', '' }
end

local function decode(s, pos)
	local f = { struct.unpack(CORE, s, pos) }
	local c = { alat = f[1], alon = f[2], spread2 = f[3], n = f[4], startT = f[5], lastT = f[6],
		ref = { t = f[7], lat = f[8], lon = f[9], bucket = f[10], token = f[11] },
		last = { t = f[12], lat = f[13], lon = f[14], bucket = f[15], token = f[16] },
		hasCand = f[17] % 2 == 1, outlier = f[17] >= 2, lastAcc = f[18], state = f[19], past = {},
		outlier2 = f[35] }
	for i = 1, PAST do
		local k = 19 + 5 * (i - 1)
		c.past[i] = { lat = f[k + 1], lon = f[k + 2], radius2 = f[k + 3], startT = f[k + 4], endT = f[k + 5] }
	end
	return c, f[#f]
end

-- lonDelta and wrapLon as in track.go (geo.WrapLongitude): longitudes the
-- short way round.
local function lonDelta(lon1, lon2)
	local d = lon1 - lon2
	if d > 180 then
		d = d - 360
	elseif d < -180 then
		d = d + 360
	end
	return d
end

local function wrapLon(l)
	return lonDelta(l, 0)
end

-- separation2 and polarSeparation2 as in track.go: polar coordinates
-- within POLAR_CAP degrees of a pole, where the tangent plane measures short.
local POLAR_CAP = 1.0
local HALF_RADIAN = 0.008726646259971648
local SINE_TERMS = { 2.8114572543455206e-15, -7.647163731819816e-13, 1.6059043836821613e-10, -2.505210838544172e-08,
	2.7557319223985893e-06, -0.0001984126984126984, 0.008333333333333333, -0.16666666666666666, 1 }

-- sine as in track.go: not math.sin, which disagrees with Go's in the last bit
local function sine(x)
	local x2 = x * x
	local s = 0
	for i = 1, #SINE_TERMS do
		s = s * x2 + SINE_TERMS[i]
	end
	return s * x
end

local function polarSeparation2(lat1, lon1, lat2, lon2)
	local r1 = (90 - math.abs(lat1)) * ky
	local r2 = (90 - math.abs(lat2)) * ky
	if (lat1 < 0) ~= (lat2 < 0) then
		r2 = (90 + math.abs(lat2)) * ky
	end
	local half = sine(lonDelta(lon1, lon2) * HALF_RADIAN)
	local dr = r1 - r2
	return dr * dr + (4 * r1) * r2 * (half * half)
end

local function separation2(lat1, lon1, lat2, lon2)
	if math.abs(lat1) > 90 - POLAR_CAP or math.abs(lat2) > 90 - POLAR_CAP then
		return polarSeparation2(lat1, lon1, lat2, lon2)
	end
	local dy = (lat1 - lat2) * ky
	local dx = lonDelta(lon1, lon2) * kx
	return dx * dx + dy * dy
end

local function dist2(plat, plon)
	return separation2(lat, lon, plat, plon)
end

local function stayRadius2(c)
	local lag = LAG * radius
	local r2 = math.min(math.max(NOISE2 * c.spread2, MARGIN2 * c.outlier2), lag * lag)
	return math.max(r2, radius * radius)
end

local function radius2(c)
	return math.max(stayRadius2(c), acc * acc)
end

-- lastAcc: the uncertainty of the accepted ping the fix is judged against
local function lag2(lastAcc)
	local lag = math.max(LAG * radius, acc)
	local l2 = lag * lag
	if still == 1 then
		local capped = acc + REST_MARGIN
		local other = math.min(lastAcc, acc)
		l2 = math.max(l2, math.min(acc * acc + other * other, capped * capped))
	end
	return l2
end

-- last: the accepted ping the backend last heard of before the fix (the
-- last accepted one; for a late ping, the stay's), lastAcc its uncertainty
local function holds(c, last, lastAcc)
	-- a speed at the very place of last is a stale fix repeated: no departure
	if moving == 1 and c.n >= SETTLED and (lat ~= last.lat or lon ~= last.lon) then
		return false
	end
	if dist2(c.alat, c.alon) > radius2(c) then
		return false
	end
	return dist2(last.lat, last.lon) <= lag2(lastAcc)
end

-- returns in track.go: back inside the stay after an accepted ping
-- outside it, however far from that ping
local function returns(c)
	if not c.hasCand or (moving == 1 and c.n >= SETTLED and (lat ~= c.last.lat or lon ~= c.last.lon)) then
		return false
	end
	return dist2(c.alat, c.alon) <= radius2(c)
end

local function reach(c)
	local dt = (t - c.lastT) / 1e6
	return math.sqrt(radius2(c)) + math.min((0.5 * ACCEL) * (dt * dt), SPEED * dt)
end

local function outlierAtRest(c)
	if moving == 1 or c.n < SETTLED or dist2(c.last.lat, c.last.lon) > lag2(c.lastAcc) then
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
	c.alon = wrapLon(c.alon + lonDelta(lon, c.alon) / c.n)
	c.spread2 = c.spread2 + (d2 - c.spread2) / c.n
	c.lastT = math.max(c.lastT, t)
	c.hasCand = false
end

-- offStay and withinWindow in track.go: in session, a fix at the stay is
-- admitted a window after an accepted ping off the settled stay and off
-- the fix
local function offStay(c)
	if c.n < SETTLED then
		return false
	end
	local r2 = math.max(radius2(c), c.lastAcc * c.lastAcc)
	return separation2(c.last.lat, c.last.lon, c.alat, c.alon) > r2 and dist2(c.last.lat, c.last.lon) > r2
end

local function withinWindow(c)
	if shape == 'sliding' then
		return t - c.ref.t < window
	end
	return t - c.last.t < window or not offStay(c)
end

local function learnOutlier(c, d2)
	c.outlier2 = math.max(c.outlier2, d2)
end

local function reason(c)
	if bucket ~= c.ref.bucket then
		return shape
	elseif lat == c.ref.lat and lon == c.ref.lon then
		return 'reobservation'
	end
	return 'jitter'
end

-- leave remembers the stay the asset is leaving, if it was settled, until
-- the departure (the last accepted ping, outside it).
local function leave(c, endT)
	if c.n < SETTLED then
		return
	end
	for i = PAST, 2, -1 do
		c.past[i] = c.past[i - 1]
	end
	c.past[1] = { lat = c.alat, lon = c.alon, radius2 = stayRadius2(c), startT = c.startT, endT = endT }
end

local function inPastStay(c)
	for i = 1, PAST do
		local p = c.past[i]
		if p.startT <= t and t <= p.endT and dist2(p.lat, p.lon) <= math.max(p.radius2, acc * acc) then
			return true, t == p.startT or t == p.endT
		end
	end
	return false, false
end

-- The state print has slots of its own for each state field (statePrint
-- in track.go), a byte each, a zero byte where the fix carries none of
-- its fields: a fix says nothing of a field it does not carry.
local NOSLOT = '\0'

local function changesState(c)
	for i = 1, 8 do
		local slot = string.sub(statep, i, i)
		if slot ~= NOSLOT and slot ~= string.sub(c.state, i, i) then
			return true
		end
	end
	return false
end

-- The state st with the slots the fix carries replaced by the fix's.
local function mergeState(st)
	local merged = ''
	for i = 1, 8 do
		local slot = string.sub(statep, i, i)
		if slot == NOSLOT then
			slot = string.sub(st, i, i)
		end
		merged = merged .. slot
	end
	return merged
end

local function judgeLate(c)
	if event == 1 or changesState(c) then
		return 'accepted', ''
	end
	if moving == 0 then
		local inPast, edge = inPastStay(c)
		if edge then
			-- The ping that began or ended a stay the asset left, released
			-- and retried.
			return 'accepted', ''
		end
		-- against the stay's last accepted ping, its place and its
		-- uncertainty: the last accepted one is later, and may be a
		-- departure far off (see track.go)
		local atStay = c.n >= SETTLED and holds(c, c.ref, c.refAcc)
		if (atStay and t > c.startT) or inPast then
			return 'suppressed', reason(c)
		end
		if atStay then
			-- The asset was here earlier than the stay knew (or this is the
			-- released ping that said so, retried).
			c.startT = t
			return 'accepted', ''
		end
	end
	if t > c.startT then
		-- Away while the stay says it was there: the stay until now is one
		-- it left, and the earliest late ping back is the return.
		leave(c, t)
		c.startT = c.lastT
		if c.lastT <= t then
			-- a departure pending since the stay's latest fix (see track.go)
			c.startT = c.last.t
		end
	end
	return 'accepted', ''
end

-- Only the current track is decoded: the undo record is carried as it is,
-- or replaced by the current track as it came in.
local oldSeenMax = struct.unpack('>i8', raw)
local undoFlag = string.byte(raw, 9 + CORE_SIZE)
local prevRaw, held = '', 0
if undoFlag == 1 then
	prevRaw = string.sub(raw, 10 + CORE_SIZE, 17 + 2 * CORE_SIZE)
	if #raw >= 25 + 2 * CORE_SIZE then
		held = struct.unpack('>i8', raw, 18 + 2 * CORE_SIZE)
	end
elseif #raw >= 17 + CORE_SIZE then
	held = struct.unpack('>i8', raw, 10 + CORE_SIZE)
end
-- the uncertainties of the stays' last accepted pings, after held; nil:
-- as the track's last accepted ping's
local refAcc, prevRefAcc
local refAt = 18 + CORE_SIZE
if undoFlag == 1 then
	refAt = 26 + 2 * CORE_SIZE
end
if #raw >= refAt + 7 then
	refAcc = struct.unpack('>d', raw, refAt)
	if undoFlag == 1 then
		prevRefAcc = struct.unpack('>d', raw, refAt + 8)
	end
end
local curRaw = string.sub(raw, 9, 8 + CORE_SIZE)
-- the request of the last accepted ping's token, whose undo record the
-- track keeps: a claim token's first 6 bytes
local lastRequest = string.sub(curRaw, LAST_TOKEN_AT, LAST_TOKEN_AT + 5)
local request = string.sub(token, 1, 6)
-- A redelivery flagged 'u' is judged again only if the track lost it (a
-- release put back the track from before its request, and since then
-- nothing seen reached its time, or only its own request's pings at that
-- very time, the track the request found had not seen it, and it is no
-- copy of one: lost in track.go) and no released ping's retry is awaited
-- (the release spent the undo record, and nothing was accepted since).
-- The latest device time the request found seen is kept after the undo
-- record; a record written before it was kept counts as having seen it.
if seen == 'u' and (undoFlag == 2 or t < oldSeenMax or (t == oldSeenMax and (copied == 1 or lastRequest ~= request
		or (undoFlag == 1 and (#raw < 17 + 2 * CORE_SIZE or struct.unpack('>i8', raw, 10 + 2 * CORE_SIZE) >= t))))) then
	return { 'suppressed', 'redelivery' }
end
local cur = decode(curRaw, 1)
cur.refAcc = refAcc or cur.lastAcc
local refAccIn = cur.refAcc

-- The fix's request becomes the one a release undoes: its first
-- acceptance keeps the track as it came in (takeUndo in track.go).
local function takeUndo()
	if undoFlag == 1 and lastRequest ~= request and string.sub(prevRaw, LAST_TOKEN_AT, LAST_TOKEN_AT + 5) == request then
		-- another request took the record from this one: releasing it will
		-- leave the track as it is (undoShared in track.go)
		prevRaw, prevRefAcc, undoFlag = '', nil, 4
	elseif lastRequest ~= request or undoFlag == 2 then
		-- the record's last token takes the fix's rank (withRank)
		prevRaw = string.sub(curRaw, 1, LAST_TOKEN_AT + 5) .. string.sub(token, 7, 8) .. string.sub(curRaw, LAST_TOKEN_AT + 8)
		prevRaw, prevRefAcc, undoFlag = prevRaw .. struct.pack('>i8', oldSeenMax), refAccIn, 1
	elseif undoFlag == 0 then
		undoFlag = 3 -- this request's first fix of the asset began the track
	end
	local l = cur.last
	cur.last = { t = l.t, lat = l.lat, lon = l.lon, bucket = l.bucket, token = token }
end

local function accept(change)
	takeUndo()
	change(cur)
	cur.lastAcc = acc
	cur.state = mergeState(cur.state)
end

local function judge()
	if t < cur.last.t then
		-- a late fix takes the last accepted ping's token, nothing else of it
		local decision, why = judgeLate(cur)
		if decision == 'accepted' then
			takeUndo()
		end
		return decision, why
	end
	-- the silence before the fix: from the latest seen, or from a later
	-- time a release forgot, once its ping was accepted again (held)
	local silence = oldSeenMax
	if held > 0 and t > held then
		silence = math.max(oldSeenMax, held)
	end
	local newSession = shape == 'session' and t - silence > idle
	-- A fix identical to the last accepted one whose seen entry is gone
	-- (released after a later claim, or expired).
	local forced = event == 1 or changesState(cur) or newSession or (t == cur.last.t and lat == cur.last.lat and lon == cur.last.lon)
	local held = holds(cur, cur.last, cur.lastAcc)
	if held or returns(cur) then
		-- Back from an excursion too far to be an outlier (a real move),
		-- or back from an outlier past the lag bound from it.
		local returned = cur.hasCand and (not cur.outlier or not held)
		if cur.hasCand and cur.outlier then
			learnOutlier(cur, separation2(cur.last.lat, cur.last.lon, cur.alat, cur.alon))
		end
		settle(cur)
		if not forced and not returned and withinWindow(cur) then
			return 'suppressed', reason(cur)
		end
		accept(function(c) c.ref, c.refAcc, c.last, c.hasCand = fixpoint, acc, fixpoint, false end)
		return 'accepted', ''
	elseif cur.hasCand then
		-- The asset left for where the last accepted ping was: judge the
		-- fix there.
		leave(cur, cur.last.t)
		cur.alat, cur.alon, cur.spread2, cur.outlier2, cur.n = cur.last.lat, cur.last.lon, 0, 0, 1
		cur.startT, cur.lastT = cur.last.t, cur.last.t
		cur.ref, cur.refAcc, cur.hasCand = cur.last, cur.lastAcc, false
		return judge()
	elseif not forced and outlierAtRest(cur) then
		learnOutlier(cur, dist2(cur.alat, cur.alon))
		return 'suppressed', reason(cur)
	end
	local outlier = couldBeOutlier(cur)
	accept(function(c) c.last, c.hasCand, c.outlier = fixpoint, true, outlier end)
	return 'accepted', ''
end

local lastT = cur.last.t
local decision, why = judge()
if seen == 'u' and decision ~= 'suppressed' then
	return { 'suppressed', 'redelivery' } -- told so whatever the track says now
end
local undo = string.char(undoFlag)
if undoFlag == 1 then
	undo = undo .. prevRaw
end
if t > math.abs(held) then
	held = 0 -- the seen max is past it
elseif held < 0 and decision == 'accepted' and t >= lastT then
	held = -held -- the released ping's retry, or what replaced it
end
-- the stays' last accepted pings' uncertainties, when one is not the
-- track's last accepted ping's
local prevLastAcc = undoFlag == 1 and struct.unpack('>d', prevRaw, LAST_ACC_AT)
prevRefAcc = prevRefAcc or prevLastAcc
local refTail = ''
if cur.refAcc ~= cur.lastAcc or prevRefAcc ~= prevLastAcc then
	refTail = struct.pack('>d', cur.refAcc)
	if undoFlag == 1 then
		refTail = refTail .. struct.pack('>d', prevRefAcc)
	end
end
if held ~= 0 or refTail ~= '' then
	undo = undo .. struct.pack('>i8', held) .. refTail
end
redis.call('SET', KEYS[1], struct.pack('>i8', math.max(oldSeenMax, t)) .. encode(cur) .. undo, 'PX', ttl)
if seen == 'u' then
	return { 'suppressed', 'redelivery' } -- folded in again; its entry stays
end
if decision == 'suppressed' and string.sub(cur.last.token, 1, 6) == request then
	-- suppressed after an acceptance of its own request: a redelivery may
	-- fold it in again, and a near cache must not answer for it
	remember(decision, 'u')
	return { decision, why, 'u' }
end
remember(decision, 's')
return { decision, why }
