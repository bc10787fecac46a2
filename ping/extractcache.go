package ping

import (
	"hash/maphash"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/seqlock"
)

// An ExtractCache remembers the pings of 2^extractCacheBits bodies.
const (
	extractCacheBits  = 12
	extractCacheSlots = 1 << extractCacheBits
)

// ExtractCache remembers what a parser's Extract made of recently read
// pings, so that a ping read again byte for byte (a sender's retry, the
// commonest duplicate) is not checked and scanned again: Extract costs a
// small body about 1.5 µs, more under load, and a hit two hashes of the
// bytes. A hit is what Extract returned for bytes with the same 128-bit
// seeded hash with this parser, which depends on nothing else; Validate,
// which reads the clock, still runs on every ping.
//
// It holds numbers only, in a fixed table (about 400 KB), so the garbage
// collector has nothing in it to scan and a miss allocates nothing. A ping
// whose strings Extract had to make rather than read in place (an escaped
// id, an event or a state) is not remembered, nor one whose local time has
// two readings, nor an error. It is safe
// for concurrent use.
type ExtractCache struct {
	parser Parser
	// stateFields is every ping's StateFields, the parser's, which a slot
	// need not keep.
	stateFields string
	seeds       [2]maphash.Seed
	slots       [extractCacheSlots]extractSlot
}

// extractSlot is a remembered ping: the hash of its bytes, its numbers,
// and where in the bytes its strings are.
type extractSlot struct {
	lock                    seqlock.Lock
	hash0, hash1            atomic.Uint64
	sec, nsec               atomic.Uint64 // the device time, UTC
	lat, lon, accuracy, spd atomic.Uint64 // float64 bits
	hasSpeed                atomic.Bool
	asset, event, state     atomic.Uint64 // a span of the bytes: offset<<32 | length
	pathsAt                 atomic.Uint32 // assetAt<<16 | timeAt
}

// NewExtractCache returns an empty cache in front of p, which should be
// prepared (see Parser.Prepared) and is not changed afterwards.
func NewExtractCache(p Parser) *ExtractCache {
	c := &ExtractCache{parser: p, seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}}
	if len(p.States) > 0 {
		c.stateFields = p.stateFields()
	}
	return c
}

// Parser is the parser the cache stands in front of, for what it does
// besides Extract (Validate).
func (c *ExtractCache) Parser() *Parser { return &c.parser }

// Extract returns what the parser's Extract returns for body, sharing
// body's memory in the same way.
func (c *ExtractCache) Extract(body []byte) (Ping, error) {
	h0, h1 := maphash.Bytes(c.seeds[0], body), maphash.Bytes(c.seeds[1], body)
	slot := &c.slots[h0>>(64-extractCacheBits)]
	if p, ok := slot.lookup(h0, h1, body); ok {
		p.StateFields = c.stateFields
		return p, nil
	}
	p, err := c.parser.Extract(body)
	if err == nil {
		slot.store(h0, h1, body, p)
	}
	return p, err
}

func (s *extractSlot) lookup(h0, h1 uint64, body []byte) (Ping, bool) {
	seq, ok := s.lock.ReadBegin()
	if !ok || s.hash0.Load() != h0 || s.hash1.Load() != h1 {
		return Ping{}, false
	}
	json := unsafe.String(unsafe.SliceData(body), len(body))
	asset, okA := substring(json, s.asset.Load())
	event, okE := substring(json, s.event.Load())
	state, okS := substring(json, s.state.Load())
	p := Ping{
		Asset: asset, Event: event, State: state,
		Time: time.Unix(int64(s.sec.Load()), int64(s.nsec.Load())).UTC(),
		Lat:  math.Float64frombits(s.lat.Load()), Lon: math.Float64frombits(s.lon.Load()),
		Accuracy: math.Float64frombits(s.accuracy.Load()),
		Speed:    math.Float64frombits(s.spd.Load()), HasSpeed: s.hasSpeed.Load(),
	}
	at := s.pathsAt.Load()
	p.assetAt, p.timeAt = uint16(at>>16), uint16(at)
	return p, okA && okE && okS && s.lock.ReadValid(seq)
}

// store remembers p, read from body, unless another writer is filling the
// slot or p cannot be told by numbers and spans of body.
func (s *extractSlot) store(h0, h1 uint64, body []byte, p Ping) {
	asset, okA := spanOf(body, p.Asset)
	event, okE := spanOf(body, p.Event)
	state, okS := spanOf(body, p.State)
	sec, nsec := p.Time.Unix(), p.Time.Nanosecond()
	// A local time of the hour its zone's clock is set back has a second
	// reading (setBack), which the server clock picks from (AtServerClock)
	// and a slot does not keep: a retry answered from it was read as the
	// later instant, an hour ahead, and refused as from the future.
	if !okA || !okE || !okS || time.Unix(sec, int64(nsec)).UTC() != p.Time || p.setBack != 0 {
		return
	}
	seq, ok := s.lock.TryLock()
	if !ok {
		return
	}
	s.hash0.Store(h0)
	s.hash1.Store(h1)
	s.sec.Store(uint64(sec))
	s.nsec.Store(uint64(nsec))
	s.lat.Store(math.Float64bits(p.Lat))
	s.lon.Store(math.Float64bits(p.Lon))
	s.accuracy.Store(math.Float64bits(p.Accuracy))
	s.spd.Store(math.Float64bits(p.Speed))
	s.hasSpeed.Store(p.HasSpeed)
	s.asset.Store(asset)
	s.event.Store(event)
	s.state.Store(state)
	s.pathsAt.Store(uint32(p.assetAt)<<16 | uint32(p.timeAt))
	s.lock.Unlock(seq)
}

// spanOf returns where s lies in body, as offset<<32 | length; ok is false
// for a string Extract made elsewhere. The empty string is the zero span.
func spanOf(body []byte, s string) (span uint64, ok bool) {
	if s == "" {
		return 0, true
	}
	if len(s) > len(body) || len(body) > math.MaxUint32 {
		return 0, false
	}
	at := uintptr(unsafe.Pointer(unsafe.StringData(s))) - uintptr(unsafe.Pointer(unsafe.SliceData(body)))
	if at > uintptr(len(body)-len(s)) { // before body (the difference wrapped) or past it
		return 0, false
	}
	return uint64(at)<<32 | uint64(len(s)), true
}

// substring returns the span of json; ok is false for a span json has not
// (a slot read while it was rewritten, which ReadValid also tells).
func substring(json string, span uint64) (string, bool) {
	at, n := span>>32, span&math.MaxUint32
	if at+n > uint64(len(json)) {
		return "", false
	}
	return json[at : at+n], true
}
