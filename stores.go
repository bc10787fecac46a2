package telemetrydedup

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// storesNamespace is where the store modules live: a store is a Caddy
// module there, and says what it offers through the interfaces below, so
// that adding a store touches its own file only.
const storesNamespace = "http.handlers.telemetry_dedup.stores"

// stores shares store clients across config reloads: a new config is
// provisioned before the old one is cleaned up, so the pool hands it the
// same memory store or Redis connections instead of new ones. Its values
// may report to the metrics (statsReporter).
var stores = caddy.NewUsagePool()

// storeModule is what every store module implements: the claim store.
type storeModule interface {
	Store() dedup.Store
}

// deadLetterer is a store that can keep the pings that cannot be keyed
// beside its claims (on_invalid dead_letter).
type deadLetterer interface {
	DeadLetters(stream string, maxLen int64) deadLetterSink
}

// nearCacher is a store whose round trips a near cache saves: it says how
// many settled keys the near cache holds by default.
type nearCacher interface {
	DefaultNearCache() int
}

// reconciling is a store whose calls can fail without saying whether they
// wrote: its reconciler settles or releases such claims by token once it
// answers again.
type reconciling interface {
	Reconciler() *dedup.Reconciler
}

// drainer is a store whose connection must outlive the config that cleans
// it up while the requests that config started still run (a reload does
// not wait for them): the handler counts its requests in the counter it
// is given, and the store lets go of the connection once none runs, or
// inFlight after the cleanup at the latest.
type drainer interface {
	drainWithin(inFlight time.Duration) *atomic.Int64
}

// timeoutStore is a store whose operations each take at most a timeout:
// what settling or releasing a claim may take, which the bound on the
// upstream request leaves room for.
type timeoutStore interface {
	operationTimeout() time.Duration
}

// statsReporter is a shared store value in the pool that reports to the
// metrics. Each fills in what it has.
type statsReporter interface {
	stats() storeStats
}

// storeStats is what one shared store reports.
type storeStats struct {
	keys, evictions      uint64 // held in process, and dropped to stay bounded
	breakerOpen          bool
	roundTrips, commands uint64
	reconciling          uint64 // claims waiting for the store to answer
}

// retired holds the counts of the shared stores a reload let go of, so
// that the counters summed over the stores in use never go down (to
// Prometheus, a counter that drops was reset).
var retired struct {
	evictions, roundTrips, commands atomic.Uint64
}

// retire keeps the counts of a shared store as it is let go of.
func retire(s storeStats) {
	retired.evictions.Add(s.evictions)
	retired.roundTrips.Add(s.roundTrips)
	retired.commands.Add(s.commands)
}

// sumStoreStats adds up the reports of every shared store in use, and the
// counts of those let go of.
func sumStoreStats() storeStats {
	total := storeStats{
		evictions:  retired.evictions.Load(),
		roundTrips: retired.roundTrips.Load(),
		commands:   retired.commands.Load(),
	}
	stores.Range(func(_, v any) bool {
		if r, ok := v.(statsReporter); ok {
			s := r.stats()
			total.keys += s.keys
			total.evictions += s.evictions
			total.roundTrips += s.roundTrips
			total.commands += s.commands
			total.reconciling += s.reconciling
		}
		return true
	})
	return total
}

// openBreakers counts the shared stores whose circuit breaker is open.
func openBreakers() int {
	open := 0
	stores.Range(func(_, v any) bool {
		if r, ok := v.(statsReporter); ok && r.stats().breakerOpen {
			open++
		}
		return true
	})
	return open
}

// storeModuleOf returns a new, unprovisioned instance of the store a
// handler's JSON names (memory when it names none), to ask what it offers
// before Caddy loads it.
func storeModuleOf(raw json.RawMessage) (caddy.Module, error) {
	name := "memory"
	if raw != nil {
		var s struct{ Type string }
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, &dedup.ConfigError{Option: "store", Problem: fmt.Sprintf(
				"%s is not a store object; write it as {\"type\":\"memory\"} or {\"type\":\"redis\",\"url\":\"redis://127.0.0.1:6379/0\"}", raw)}
		}
		name = s.Type
	}
	info, err := caddy.GetModule(storesNamespace + "." + name)
	if err != nil {
		return nil, &dedup.ConfigError{Option: "store", Problem: fmt.Sprintf("unknown store %q; use %s", name, storeNames())}
	}
	return info.New(), nil
}

// storeTimeoutOf is the per-operation timeout of the store a handler's JSON
// configures, or 0 for a store without one (in process).
func storeTimeoutOf(raw json.RawMessage) (time.Duration, error) {
	mod, err := storeModuleOf(raw)
	if err != nil {
		return 0, err
	}
	if raw != nil {
		if err := json.Unmarshal(raw, mod); err != nil {
			return 0, &dedup.ConfigError{Option: "store", Problem: err.Error()}
		}
	}
	if ts, ok := mod.(timeoutStore); ok {
		return ts.operationTimeout(), nil
	}
	return 0, nil
}

// storeNames lists the registered stores for error messages.
func storeNames() string {
	var names []string
	for _, m := range caddy.GetModules(storesNamespace) {
		names = append(names, m.ID.Name())
	}
	slices.Sort(names)
	return strings.Join(names, " or ")
}
