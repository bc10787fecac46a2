package telemetrydedup

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// loadMemoryConfig loads a handler on the memory store with maxKeys.
func loadMemoryConfig(t *testing.T, maxKeys int) (*tableTester, func()) {
	t.Helper()
	return loadConfig(t, fmt.Sprintf(`{"key_prefix":"maxkeys:","store":{"type":"memory","max_keys":%d}}`, maxKeys))
}

// Raising max_keys is what an operator does when the store evicts: the
// reload must keep every claim, or every parked asset's next ping is
// admitted again. Lowering it evicts the keys closest to expiry, once the
// old config lets go.
func TestAReloadThatChangesMaxKeysKeepsTheClaims(t *testing.T) {
	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	pingOf := func(i int) string {
		return fmt.Sprintf(`{"asset_id":"veh-%d","occurred_at":%q,"lat":52.52,"lon":13.4}`, i, at.Format(time.RFC3339))
	}
	first, unloadFirst := loadMemoryConfig(t, 100)
	for i := range 10 {
		if res := first.post(pingOf(i), "application/json", nil); res.status != http.StatusCreated {
			t.Fatalf("ping %d: %d %s", i, res.status, res.body)
		}
	}
	raised, unloadRaised := loadMemoryConfig(t, 200)
	unloadFirst()
	for i := range 10 {
		if res := raised.post(pingOf(i), "application/json", nil); res.header.Get("X-Dedup") != "suppressed" {
			t.Fatalf("ping %d again after raising max_keys: %d %s, want suppressed", i, res.status, res.header.Get("X-Dedup"))
		}
	}
	_, unloadLowered := loadMemoryConfig(t, 4)
	defer unloadLowered()
	var store *dedup.MemoryStore
	stores.Range(func(key, value any) bool {
		if key == memoryPoolKey {
			store = value.(*memoryStoreValue).MemoryStore
		}
		return true
	})
	if n := store.Len(); n != 10 {
		t.Fatalf("%d keys while the config with max_keys 200 is loaded, want all 10", n)
	}
	unloadRaised()
	if n := store.Len(); n != 4 {
		t.Fatalf("%d keys once only max_keys 4 is loaded, want 4", n)
	}
}
