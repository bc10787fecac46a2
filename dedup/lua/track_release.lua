-- Release an accepted sliding/session claim: forget the ping in its seen
-- set, and if it is still the asset's last accepted ping, put the track back
-- as it was before its request (trackState.undo in Go), leaving its
-- request, with the rank of the claim that took the record, as the last
-- accepted ping's token; if a later one was accepted since, another
-- request's release spent the undo record, or its own request's did and
-- the claim was ranked before the record was taken, forget the state fields
-- it reported (forgetState) and mark it 'r' in its seen set instead
-- (flagReleased): the track still holds it, and its retry is accepted.
-- Only the claim's own token acts.
-- KEYS[1] track, KEYS[2] seen set; ARGV[1] seen field, ARGV[2] token (8 bytes),
-- ARGV[3] the print of its state fields (8 bytes, a slot a byte)
local CORE = '>dddi8i8i8i8ddi8c8i8ddi8c8Bdc8dddi8i8dddi8i8dddi8i8d' -- as in track_decide.lua
local CORE_SIZE = 273
-- where the state print starts in the track: after the seen max (8 bytes)
-- and the fields of CORE before it
local STATE_AT = 9 + struct.size('>dddi8i8i8i8ddi8c8i8ddi8c8Bd')
-- where the last accepted ping's uncertainty starts in a CORE
local LAST_ACC_AT = 1 + struct.size('>dddi8i8i8i8ddi8c8i8ddi8c8B')
-- where the last accepted ping's token starts in a CORE
local LAST_TOKEN_AT = 1 + struct.size('>dddi8i8i8i8ddi8c8i8ddi8')
local NOSLOT = '\0'

local released = 0
local v = redis.call('HGET', KEYS[2], ARGV[1])
local retried = false -- an 'r' ping's retry, which left the track as it was
if v and string.sub(v, 1, 1) ~= 's' and string.sub(v, 2, 9) == ARGV[2] then
	released = 1
	retried = string.sub(v, 26, 26) == 'r'
end
-- the ping is out of the track, or the track is gone: its entry goes
local function forget()
	if released == 1 then
		redis.call('HDEL', KEYS[2], ARGV[1])
	end
	return released
end
local st = redis.call('GET', KEYS[1])
if not st then
	return forget()
end
local fields = { struct.unpack(CORE, st, 9) }
-- after the track, what releasing its last accepted ping does (see
-- track_decide.lua): 0 and 3 delete it, 1 put back the track that follows,
-- 2 and 4 keep it
local undo = string.byte(st, 9 + CORE_SIZE)
-- a token's rank in its request, its lower 16 bits (see Deduper.ClaimAll)
local function rank(token)
	return struct.unpack('>H', token, 7)
end
if undo == 2 and string.sub(fields[16], 1, 6) == string.sub(ARGV[2], 1, 6) and rank(ARGV[2]) >= rank(fields[16]) and not retried then
	return forget() -- its request's release put back the track from before it
end
if fields[16] == ARGV[2] and undo ~= 2 and undo ~= 4 then -- the last accepted ping's token
	if undo == 1 then
		local prev = string.sub(st, 10 + CORE_SIZE, 9 + 2 * CORE_SIZE)
		-- the latest device time seen goes back too: as it was before the
		-- request, kept after the track; in a track written before it was
		-- kept, as far as the track tells it (the later of its last
		-- accepted ping and last fix there)
		local seenMax
		if #st >= 17 + 2 * CORE_SIZE then
			seenMax = struct.unpack('>i8', st, 10 + 2 * CORE_SIZE)
		else
			local p = { struct.unpack(CORE, prev) }
			seenMax = math.max(p[12], p[6])
		end
		-- what was seen after the released ping is held, for the pings
		-- after it once the retry is back (trackState.held)
		local held = 0
		if #st >= 25 + 2 * CORE_SIZE then
			held = math.abs(struct.unpack('>i8', st, 18 + 2 * CORE_SIZE))
		end
		local seen = struct.unpack('>i8', st)
		if seen > fields[12] then
			held = math.max(held, seen)
		end
		-- and the uncertainty of its stay's last accepted ping, if the track
		-- keeps it (see track_decide.lua): when it is not its last's
		local refTail = ''
		if #st >= 41 + 2 * CORE_SIZE then
			local refAcc = struct.unpack('>d', st, 34 + 2 * CORE_SIZE)
			if refAcc ~= struct.unpack('>d', prev, LAST_ACC_AT) then
				refTail = struct.pack('>d', refAcc)
			end
		end
		local tail = ''
		if held ~= 0 or refTail ~= '' then
			tail = struct.pack('>i8', -held) .. refTail
		end
		-- the spent record's token, the request's with the rank of the
		-- claim that took the record: the request's other claims find the
		-- track from before it, but for those ranked before that one, which
		-- it holds
		prev = string.sub(prev, 1, LAST_TOKEN_AT - 1) .. string.sub(ARGV[2], 1, 6) .. string.sub(prev, LAST_TOKEN_AT + 6)
		redis.call('SET', KEYS[1], struct.pack('>i8', seenMax) .. prev .. '\2' .. tail, 'KEEPTTL')
	else -- the ping, or its request, began the track
		redis.call('DEL', KEYS[1])
	end
	return forget()
end
if released == 0 then
	return 0 -- the ping is not this claim's any more: a retry took it
end
-- the track still holds the ping: its retry is accepted
redis.call('HSET', KEYS[2], ARGV[1], 'r')

-- The 8 bytes of state at at without the slots that equal the ping's.
local function forgotten(t, at)
	local state, kept = string.sub(t, at, at + 7), ''
	for i = 1, 8 do
		local slot, mine = string.sub(state, i, i), string.sub(ARGV[3], i, i)
		if mine ~= NOSLOT and slot == mine then
			slot = NOSLOT
		end
		kept = kept .. slot
	end
	return string.sub(t, 1, at - 1) .. kept .. string.sub(t, at + 8)
end

local kept = forgotten(st, STATE_AT)
if undo == 1 then -- and in the undo record after it
	kept = forgotten(kept, STATE_AT + CORE_SIZE + 1)
end
if kept ~= st then
	redis.call('SET', KEYS[1], kept, 'KEEPTTL')
end
return released
