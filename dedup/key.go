package dedup

import (
	"encoding/hex"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/uber/h3-go/v4"
	"golang.org/x/crypto/blake2b"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/ping"
)

// Defaults of the key contract. Changing any of them invalidates every key
// already in a store.
const (
	DefaultWindow     = 5 * time.Minute
	DefaultResolution = 12
	DefaultKeyPrefix  = "dedup:"
	// MaxWindow is the longest window: a year, far beyond any backend's
	// need, and short enough that every duration derived from it fits.
	MaxWindow = 366 * 24 * time.Hour
)

// Keyer quantises pings into keys. Window, Resolution and Prefix are the
// key contract: two processes with the same Keyer compute the same key for
// the same ping without coordinating, and a change to any of them starts a
// fresh key space.
type Keyer struct {
	// Window is the tumbling bucket width; a whole number of seconds.
	Window time.Duration
	// Resolution is the H3 resolution, 0 (coarsest) to 15 (finest).
	Resolution int
	// Prefix starts every key, so several deployments can share one store.
	Prefix string
	// Cells, if set, remembers the cells of recent coordinates. It saves
	// time, never changes a key.
	Cells *CellCache
}

// Observation is a ping with its quantised parts and key.
type Observation struct {
	// Ping is the ping as read from the request.
	ping.Ping
	// Bucket is the device epoch second floored to the window.
	Bucket int64
	// Cell is the H3 cell of the position at the configured resolution;
	// zero where the shape decides without one (see Deduper.Observe).
	Cell h3.Cell
	// Key is Prefix + hex(blake2b-128(asset "|" bucket "|" cell)), the
	// article's layout, for every ping that carries neither a state nor an
	// event. A state adds its value, so that a change of it is a new key;
	// an event adds itself and the exact sighting (device time and
	// coordinates), so that only the ping's own redeliveries share its key
	// and no re-observation or jitter ever meets it. Empty, as Cell is
	// zero, where the shape decides without it.
	Key string
}

// Check reports a Keyer that cannot produce keys, naming the option to fix.
func (k Keyer) Check() error {
	if k.Window < time.Second || k.Window%time.Second != 0 {
		return &ConfigError{Option: "window", Problem: fmt.Sprintf(
			"%s is not a whole number of seconds of at least 1s; buckets are device epoch seconds floored to the window", k.Window)}
	}
	if k.Window > MaxWindow {
		return &ConfigError{Option: "window", Problem: fmt.Sprintf(
			"%s is longer than %s; a window is how long a parked asset stays quiet, minutes to hours, e.g. 5m", k.Window, MaxWindow)}
	}
	if strings.ContainsAny(k.Prefix, "{}") {
		return &ConfigError{Option: "key_prefix", Problem: fmt.Sprintf(
			"%q holds a brace: a placeholder is not expanded here (the prefix is written as it is), and a Redis Cluster hash tag would put every key in one slot; "+
				"for keys per tenant use key_scope {http.request.host}, and for an environment variable in a Caddyfile {$NAME}, which Caddy expands when it reads the file", k.Prefix)}
	}
	if k.Resolution < 0 || k.Resolution > 15 {
		return &ConfigError{Option: "resolution", Problem: fmt.Sprintf(
			"%d is not an H3 resolution; use 0 (cell edges of ~1300 km) to 15 (~0.5 m); 12 (~9 m) suits vehicle GPS", k.Resolution)}
	}
	return nil
}

// Observe quantises a validated ping. The coordinates must already have
// passed Parser.Validate: H3 turns a latitude of 91 into a valid-looking
// cell that no real position maps to.
func (k Keyer) Observe(p ping.Ping) Observation {
	o := Observation{
		Ping:   p,
		Bucket: k.Bucket(p.Time),
		Cell:   k.Cell(p.Lat, p.Lon),
	}
	o.Key = k.observationKey(p, o.Bucket, o.Cell)
	return o
}

// Cell is the H3 cell of a validated position at the Keyer's resolution.
func (k Keyer) Cell(lat, lon float64) h3.Cell {
	ll := h3.NewLatLng(lat, lon)
	if k.Cells == nil {
		return h3.LatLngToCell(ll, k.Resolution)
	}
	return k.Cells.Cell(ll, k.Resolution)
}

// Bucket floors the device time to the window, in epoch seconds. The floor
// is what makes the bucket stateless: every process computes the same
// boundary.
func (k Keyer) Bucket(t time.Time) int64 {
	w := int64(k.Window / time.Second)
	epoch := t.Unix()
	return epoch - mod(epoch, w)
}

// Key hashes exactly the three parts, in the layout of the design article,
// so that keys computed by its Python reference and by this module agree.
func (k Keyer) Key(asset string, bucket int64, cell h3.Cell) string {
	return k.observationKey(ping.Ping{Asset: asset}, bucket, cell)
}

// KeyOf is the key of ping p in bucket and cell, as Observe makes it: its
// state and event are part of it. A replay that has quantised its pings
// already keys them with it.
func (k Keyer) KeyOf(p ping.Ping, bucket int64, cell h3.Cell) string {
	return k.observationKey(p, bucket, cell)
}

// observationKey is the key of a ping in its bucket and cell: the
// article's three parts, then its state and its event with the exact
// sighting, each only when the ping has one. Values are length-prefixed, so
// that no asset, state or event spells another's.
func (k Keyer) observationKey(p ping.Ping, bucket int64, cell h3.Cell) string {
	h := hashers.Get().(*hasher)
	defer hashers.Put(h)
	h.buf = append(h.buf[:0], p.Asset...)
	h.buf = append(h.buf, '|')
	h.buf = strconv.AppendInt(h.buf, bucket, 10)
	h.buf = append(h.buf, '|')
	h.buf = strconv.AppendUint(h.buf, uint64(cell), 16)
	if p.State != "" {
		h.buf = appendPart(h.buf, 's', p.State)
	}
	if p.Event != "" {
		h.buf = appendPart(h.buf, 'e', p.Event)
		h.buf = append(h.buf, '|')
		h.buf = strconv.AppendInt(h.buf, p.Time.Unix(), 10)
		h.buf = append(h.buf, '.')
		h.buf = strconv.AppendInt(h.buf, int64(p.Time.Nanosecond()), 10)
		h.buf = append(h.buf, '|')
		h.buf = strconv.AppendFloat(h.buf, p.Lat, 'g', -1, 64)
		h.buf = append(h.buf, '|')
		h.buf = strconv.AppendFloat(h.buf, p.Lon, 'g', -1, 64)
	}
	return h.key(k.Prefix, "")
}

// appendPart appends "|" tag length ":" value.
func appendPart(buf []byte, tag byte, value string) []byte {
	buf = append(buf, '|', tag)
	buf = strconv.AppendInt(buf, int64(len(value)), 10)
	buf = append(buf, ':')
	return append(buf, value...)
}

// ScopeSeparator ends the scope in a scoped identity (see ScopedAsset): the
// ASCII unit separator, a control character no asset id may hold.
const ScopeSeparator = "\x1f"

// ScopedAsset is the asset's identity inside a key scope (a tenant, a host):
// the scope's length, ":", the scope, ScopeSeparator and the asset. The
// length says where the scope ends, so no two scope and asset pairs spell
// the same identity; the separator is a control character, which asset ids
// may not hold (ping.Parser.Validate), so no asset id of an unscoped handler
// spells a scoped identity either: "12:acme.example/truck-2" is just an
// asset. Without a scope it is the asset itself, and the key layout is the
// article's.
func ScopedAsset(scope, asset string) string {
	if scope == "" {
		return asset
	}
	return strconv.Itoa(len(scope)) + ":" + scope + ScopeSeparator + asset
}

// SplitScopedAsset returns the scope and the asset of an identity
// ScopedAsset made, for people to read: the scope is empty for an unscoped
// one.
func SplitScopedAsset(id string) (scope, asset string) {
	n, rest, ok := strings.Cut(id, ":")
	size, err := strconv.Atoi(n)
	if !ok || err != nil || size < 0 || size >= len(rest) || rest[size:size+len(ScopeSeparator)] != ScopeSeparator {
		return "", id
	}
	return rest[:size], rest[size+len(ScopeSeparator):]
}

// TrackKeys returns the keys of the sliding and session shapes: the asset's
// track, and the seen set of the minute of device time t. The asset's hash
// sits in braces, a Redis Cluster hash tag, so that one script can reach
// both keys. The track's suffix names its layout: ":t" since the stay
// remembers its outliers, ":s" before, so that instances of either version
// sharing a Redis during an upgrade never read each other's tracks.
func (k Keyer) TrackKeys(asset string, t time.Time) (state, seen string) {
	h := hashers.Get().(*hasher)
	defer hashers.Put(h)
	h.buf = append(h.buf[:0], asset...)
	tag := h.key(k.Prefix+"{", "}")
	minute := t.Unix() - mod(t.Unix(), 60)
	return tag + ":t", tag + ":m" + strconv.FormatInt(minute, 10)
}

// hasher hashes key material without allocating: the BLAKE2b state and the
// buffer the material is assembled in are reused through hashers.
type hasher struct {
	blake hash.Hash
	buf   []byte
	sum   [16]byte
}

var hashers = sync.Pool{New: func() any {
	h, _ := blake2b.New(16, nil) // only fails for a size outside 1..64 or a key over 64 bytes
	return &hasher{blake: h, buf: make([]byte, 0, 128)}
}}

// key returns before + hex(blake2b-128(h.buf)) + after, in one allocation.
func (h *hasher) key(before, after string) string {
	h.blake.Reset()
	h.blake.Write(h.buf)
	var b strings.Builder
	b.Grow(len(before) + 2*len(h.sum) + len(after))
	b.WriteString(before)
	var digits [2 * len(h.sum)]byte
	hex.Encode(digits[:], h.blake.Sum(h.sum[:0]))
	b.Write(digits[:])
	b.WriteString(after)
	return b.String()
}

// mod is the floor modulo, so that buckets before 1970 still floor downwards.
func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}
