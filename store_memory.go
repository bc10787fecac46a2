package telemetrydedup

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

func init() {
	caddy.RegisterModule(MemoryStore{})
}

// MemoryStore keeps claims inside the Caddy process: the embedded default.
// Every handler of the process shares one store, which survives config
// reloads, a reload that changes max_keys included, and one through a
// config that uses it nowhere (kept until its keys have expired), but not
// restarts; it is not shared between Caddy instances: use the redis store
// for that.
type MemoryStore struct {
	// The most keys held at once. When full, the key closest to expiry is
	// evicted. The shared store holds the largest max_keys any loaded
	// config sets. Default: 1000000.
	MaxKeys int `json:"max_keys,omitempty"`

	shared *memoryStoreValue
}

// memoryPoolKey names the one memory store of the process in the pool.
const memoryPoolKey = "memory"

// CaddyModule returns the Caddy module information.
func (MemoryStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.telemetry_dedup.stores.memory",
		New: func() caddy.Module { return new(MemoryStore) },
	}
}

// Provision takes the shared store, creating it if no config holds it
// yet, and counts this config's max_keys toward its bound.
func (m *MemoryStore) Provision(caddy.Context) error {
	if m.MaxKeys < 0 {
		return fmt.Errorf("max_keys %d: use a positive number of keys", m.MaxKeys)
	}
	if m.MaxKeys == 0 {
		m.MaxKeys = dedup.DefaultMaxKeys
	}
	v, _, err := stores.LoadOrNew(memoryPoolKey, func() (caddy.Destructor, error) {
		if v := idleMemory.take(); v != nil {
			return v, nil
		}
		v := &memoryStoreValue{MemoryStore: dedup.NewMemoryStore(m.MaxKeys), bounds: map[int]int{}}
		report(v)
		return v, nil
	})
	if err != nil {
		return err
	}
	m.shared = v.(*memoryStoreValue)
	m.shared.bound(m.MaxKeys, 1)
	return nil
}

// Cleanup lets go of the shared store; the last config to do so frees it.
func (m *MemoryStore) Cleanup() error {
	if m.shared == nil {
		return nil
	}
	m.shared.bound(m.MaxKeys, -1)
	_, err := stores.Delete(memoryPoolKey)
	return err
}

// Store returns the claim store.
func (m *MemoryStore) Store() dedup.Store { return m.shared.MemoryStore }

// keySpace is the process's one memory store, which every config shares.
func (m *MemoryStore) keySpace() string { return "memory" }

// UnmarshalCaddyfile sets up the store from Caddyfile tokens:
//
//	store memory {
//		max_keys <n>
//	}
func (m *MemoryStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume store name
	if d.NextArg() {
		return d.Errf("store memory takes no arguments, got %q; options go in its block", d.Val())
	}
	var maxKeysLine int
	for d.NextBlock(0) {
		switch d.Val() {
		case "max_keys":
			if maxKeysLine != 0 {
				return d.Errf("max_keys already specified on line %d; give each option once", maxKeysLine)
			}
			maxKeysLine = d.Line()
			if err := intArg(d, &m.MaxKeys, 1, "a positive whole number, e.g. max_keys 1000000"); err != nil {
				return withSyntax(d, err, "max_keys", "<n>, e.g. max_keys 1000000")
			}
		case "{":
			if maxKeysLine != 0 {
				return noBlockError(d, "max_keys", "<n>")
			}
			return d.Errf("store memory takes its options in one block: store memory { max_keys <n> }")
		default:
			if err := optionOfHandler(d, "memory", d.Val()); err != nil {
				return err
			}
			return d.Errf("unrecognized store memory option %q; the memory store takes max_keys", d.Val())
		}
	}
	return nil
}

// memoryStoreValue lets the memory store live in the usage pool, and
// keeps how many loaded configs ask for each max_keys: during a reload the
// old config and the new one both hold it. The store has nothing to close:
// once the pool drops it, idleMemory keeps it until its keys have expired,
// and it is garbage after that.
type memoryStoreValue struct {
	*dedup.MemoryStore
	mu     sync.Mutex
	bounds map[int]int // max_keys -> configs that set it
}

// bound adds delta configs that set maxKeys, and makes the store hold the
// largest max_keys still set: a reload that raises it does not evict
// before the old config lets go, and one that lowers it evicts then.
func (v *memoryStoreValue) bound(maxKeys, delta int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.bounds[maxKeys] += delta
	if v.bounds[maxKeys] <= 0 {
		delete(v.bounds, maxKeys)
	}
	if len(v.bounds) > 0 {
		v.SetMaxKeys(slices.Max(slices.Collect(maps.Keys(v.bounds))))
	}
}

// Destruct hands the store no loaded config uses any more to idleMemory.
func (v *memoryStoreValue) Destruct() error {
	idleMemory.keep(v)
	return nil
}

// idleMemory holds the memory store while no loaded config uses it, until
// the last key it holds has expired: a reload to a config without it (a
// trial of the redis store, the directive taken out for a while) and one
// back is no restart, and the store comes back with its claims. Dropped
// with the pool, it came back empty, and every redelivery of the last TTL
// was delivered again. Kept for good, a process that no longer uses it
// would hold its keys until restart; once they have expired it holds
// nothing a new store would not.
var idleMemory = idleStore{hold: time.Hour}

// idleStore is a memory store no loaded config uses, and the timer that
// drops it once its keys have expired.
type idleStore struct {
	// hold is the least a store is held: Caddy cleans a config up while
	// its requests still run, and one whose body was still arriving
	// claims after (with an empty store, the drop came first, and the
	// claim went with it). An hour is longer than any of them runs.
	hold  time.Duration
	mu    sync.Mutex
	value *memoryStoreValue
	drop  *time.Timer
}

// keep holds v for hold, or until its keys have expired if later.
func (s *idleStore) keep(v *memoryStoreValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.value = v
	s.dropAfter(v, max(v.ExpiresIn(), s.hold))
}

// dropAfter lets go of v after d, unless it has keys then, claimed by a
// request of the config that let go of it: then once they have expired.
// It is called with mu held.
func (s *idleStore) dropAfter(v *memoryStoreValue, d time.Duration) {
	s.drop = time.AfterFunc(d, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.value != v {
			return
		}
		if left := v.ExpiresIn(); left > 0 {
			s.dropAfter(v, left)
			return
		}
		s.value = nil
		retire(v)
	})
}

// take returns the store held, if any, for a config that uses it again.
func (s *idleStore) take() *memoryStoreValue {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.value
	if v != nil {
		s.drop.Stop()
		s.value = nil
	}
	return v
}

func (v *memoryStoreValue) stats() storeStats {
	return storeStats{keys: uint64(v.Len()), evictions: v.Evictions()}
}

// Interface guards
var (
	_ caddy.Provisioner     = (*MemoryStore)(nil)
	_ caddy.CleanerUpper    = (*MemoryStore)(nil)
	_ caddyfile.Unmarshaler = (*MemoryStore)(nil)
	_ storeModule           = (*MemoryStore)(nil)
	_ statsReporter         = (*memoryStoreValue)(nil)
)
