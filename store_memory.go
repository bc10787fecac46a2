package telemetrydedup

import (
	"fmt"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

func init() {
	caddy.RegisterModule(MemoryStore{})
}

// MemoryStore keeps claims inside the Caddy process: the embedded default.
// It survives config reloads (every handler with the same max_keys shares
// one store, kept while any config uses it) but not restarts, and it is not
// shared between Caddy instances: use the redis store for that.
type MemoryStore struct {
	// The most keys held at once. When full, the key closest to expiry is
	// evicted. Default: 1000000.
	MaxKeys int `json:"max_keys,omitempty"`

	poolKey string
	store   *dedup.MemoryStore
}

// CaddyModule returns the Caddy module information.
func (MemoryStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.telemetry_dedup.stores.memory",
		New: func() caddy.Module { return new(MemoryStore) },
	}
}

// Provision takes the shared store for this max_keys, creating it if no
// config holds it yet.
func (m *MemoryStore) Provision(caddy.Context) error {
	if m.MaxKeys < 0 {
		return fmt.Errorf("max_keys %d: use a positive number of keys", m.MaxKeys)
	}
	if m.MaxKeys == 0 {
		m.MaxKeys = dedup.DefaultMaxKeys
	}
	m.poolKey = "memory max_keys=" + strconv.Itoa(m.MaxKeys)
	v, _, err := stores.LoadOrNew(m.poolKey, func() (caddy.Destructor, error) {
		return memoryStoreValue{dedup.NewMemoryStore(m.MaxKeys)}, nil
	})
	if err != nil {
		return err
	}
	m.store = v.(memoryStoreValue).MemoryStore
	return nil
}

// Cleanup lets go of the shared store; the last config to do so frees it.
func (m *MemoryStore) Cleanup() error {
	if m.poolKey == "" {
		return nil
	}
	_, err := stores.Delete(m.poolKey)
	return err
}

// Store returns the claim store.
func (m *MemoryStore) Store() dedup.Store { return m.store }

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
	for d.NextBlock(0) {
		switch d.Val() {
		case "max_keys":
			if m.MaxKeys != 0 {
				return d.Err("max_keys already specified")
			}
			var value string
			if !d.AllArgs(&value) {
				return d.Err("max_keys takes one value: max_keys <n>, e.g. max_keys 1000000")
			}
			n, err := strconv.Atoi(value)
			if err != nil || n <= 0 {
				return d.Errf("max_keys %q: use a positive whole number, e.g. max_keys 1000000", value)
			}
			m.MaxKeys = n
		default:
			return d.Errf("unrecognized store memory option %q; the memory store takes max_keys", d.Val())
		}
	}
	return nil
}

// memoryStoreValue lets a memory store live in the usage pool. The store has
// nothing to close: it is garbage once the pool drops it.
type memoryStoreValue struct{ *dedup.MemoryStore }

func (memoryStoreValue) Destruct() error { return nil }

func (m memoryStoreValue) stats() storeStats {
	return storeStats{keys: uint64(m.Len()), evictions: m.Evictions()}
}

// Interface guards
var (
	_ caddy.Provisioner     = (*MemoryStore)(nil)
	_ caddy.CleanerUpper    = (*MemoryStore)(nil)
	_ caddyfile.Unmarshaler = (*MemoryStore)(nil)
	_ storeModule           = (*MemoryStore)(nil)
	_ statsReporter         = memoryStoreValue{}
)
