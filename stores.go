package telemetrydedup

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
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

// storeModule is what every store module implements: the claim store, and
// the name of the data its keys live in (two handlers whose stores name
// the same, with the same key_prefix, meet each other's claims).
type storeModule interface {
	Store() dedup.Store
	keySpace() string
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

// keyPrefixed is a store whose connection the stores of other handlers may
// share, and that may hand its work on their keys to another connection:
// the handler tells it the key_prefix its keys are under.
type keyPrefixed interface {
	servesPrefix(prefix string)
}

// timeoutStore is a store whose operations each take at most a timeout:
// what settling or releasing a claim may take, which the bound on the
// upstream request leaves room for.
type timeoutStore interface {
	operationTimeout() time.Duration
}

// statsReporter is a shared store value that reports to the metrics.
// Each fills in what it has.
type statsReporter interface {
	stats() storeStats
}

// storeStats is what one shared store reports.
type storeStats struct {
	keys, evictions      uint64 // held in process, and dropped to stay bounded
	breakersOpen         int    // open circuit breakers: on a Cluster, one per master skipped
	roundTrips, commands uint64
	reconciling          uint64 // claims waiting for the store to answer
}

// reporting holds the shared stores that report to the metrics, from
// their creation until they are let go of, and the counts of those let go
// of, so that the counters summed over them never go down (to Prometheus,
// a counter that drops was reset). A store leaves it at the end of its
// Destruct, not when the usage pool lets go of it, which is before a
// connection has finished closing.
var reporting struct {
	sync.Mutex
	live    map[statsReporter]struct{}
	retired storeStats // evictions, roundTrips and commands only
}

// report makes a shared store count in the metrics.
func report(r statsReporter) {
	reporting.Lock()
	defer reporting.Unlock()
	if reporting.live == nil {
		reporting.live = map[statsReporter]struct{}{}
	}
	reporting.live[r] = struct{}{}
}

// retire keeps the counts of a shared store that is let go of, and stops
// asking it.
func retire(r statsReporter) {
	reporting.Lock()
	defer reporting.Unlock()
	s := r.stats()
	reporting.retired.evictions += s.evictions
	reporting.retired.roundTrips += s.roundTrips
	reporting.retired.commands += s.commands
	delete(reporting.live, r)
}

// sumStoreStats adds up the reports of every shared store in use, and the
// counts of those let go of.
func sumStoreStats() storeStats {
	reporting.Lock()
	defer reporting.Unlock()
	total := reporting.retired
	for r := range reporting.live {
		s := r.stats()
		total.keys += s.keys
		total.evictions += s.evictions
		total.roundTrips += s.roundTrips
		total.commands += s.commands
		total.reconciling += s.reconciling
		total.breakersOpen += s.breakersOpen
	}
	return total
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
