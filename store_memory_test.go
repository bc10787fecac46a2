package telemetrydedup

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
)

// forgetIdleMemory lets go of the memory store no loaded config holds, as
// a restart would: a test that counts on an empty store starts with one,
// whatever the tests before it left there. The helpers that provision a
// handler call it when their test ends, so that a test run again
// (-count) does not find its own claims.
func forgetIdleMemory() {
	if v := idleMemory.take(); v != nil {
		retire(v)
	}
}

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

// the memory store at max_keys evicts "the key closest
// to expiry", which for one TTL is the oldest. But every telemetry_dedup of
// the process shares the one memory store, and two sites need not have the
// same TTL (ttl, retry_ladder, outage_margin, window). Then the key closest
// to expiry is the short-TTL site's newest claim, even one whose request is
// still waiting for its upstream, while the long-TTL site's hours-old
// settled keys stay: one new key of the other site evicts it, and the
// redelivery of the ping in flight (a sender that timed out) is forwarded
// again instead of being told to come back. In steady state a busy store
// is always full, so the short-TTL site's claims are the first to go, every
// time.
func TestAFullMemoryStoreDoesNotEvictAnotherSitesClaimInFlight(t *testing.T) {
	store := dedup.NewMemoryStore(3)                                      // the process's one store, at its max_keys
	long := tableHandler(t, `{"key_prefix":"evict-long:"}`)               // ttl 6h30m, the default
	short := tableHandler(t, `{"key_prefix":"evict-short:","ttl":"10m"}`) // a site with a shorter ttl
	long.h.deduper.Store, short.h.deduper.Store = store, store

	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	pingOf := func(asset string) string {
		return fmt.Sprintf(`{"asset_id":%q,"occurred_at":%q,"lat":52.52,"lon":13.4}`, asset, at.Format(time.RFC3339))
	}
	for _, asset := range []string{"old-1", "old-2"} { // settled keys of the long-TTL site
		if res := long.post(pingOf(asset), "application/json", nil); res.status != http.StatusCreated {
			t.Fatalf("setup %s: %d %s", asset, res.status, res.body)
		}
	}
	inFlight := pingOf("phone-1")
	short.claimInFlight(t, inFlight) // its request waits for the upstream: the store is full now

	if res := long.post(pingOf("new-1"), "application/json", nil); res.status != http.StatusCreated { // one new key
		t.Fatalf("the long-TTL site's new ping: %d %s", res.status, res.body)
	}
	res := short.post(inFlight, "application/json", nil)
	if got := res.header.Get("X-Dedup"); got != "in_flight" {
		t.Errorf("the redelivery of a ping whose first request is still in flight got %d %s, forwarded upstream (%d copy) beside the first: "+
			"one new key of another site evicted its claim (closest to expiry: ttl 10m) before the other site's settled keys; want in_flight",
			res.status, got, len(short.upstream))
	}
}

// with one TTL, a burst of max_keys new keys within
// in_flight_timeout evicts a claim whose request is still waiting for its
// upstream, the oldest key, and its redelivery is forwarded a second time.
// A pending claim younger than in_flight_timeout is the one key whose loss
// the design promises never to turn into a second delivery (the in-flight
// answer); a settled one costs at most a duplicate too, but only once its
// redelivery comes.
func TestAMemoryStoreBurstDoesNotEvictAClaimInFlight(t *testing.T) {
	store := dedup.NewMemoryStore(4)
	h := tableHandler(t, `{"key_prefix":"evict-burst:"}`)
	h.h.deduper.Store = store
	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	pingOf := func(asset string) string {
		return fmt.Sprintf(`{"asset_id":%q,"occurred_at":%q,"lat":52.52,"lon":13.4}`, asset, at.Format(time.RFC3339))
	}
	inFlight := pingOf("veh-0")
	h.claimInFlight(t, inFlight)
	for i := 1; i <= 4; i++ { // the burst, well within in_flight_timeout
		if res := h.post(pingOf(fmt.Sprintf("veh-%d", i)), "application/json", nil); res.status != http.StatusCreated {
			t.Fatalf("burst ping %d: %d %s", i, res.status, res.body)
		}
	}
	res := h.post(inFlight, "application/json", nil)
	if got := res.header.Get("X-Dedup"); got != "in_flight" {
		t.Errorf("the redelivery of a ping still in flight got %d %s (forwarded upstream a second time) after a burst of max_keys new keys evicted its pending claim; want in_flight",
			res.status, got)
	}
}

// in sliding (and session) the memory store evicts a
// seen entry like any key. Evicted while its request waits for the
// upstream, the ping's release finds no entry, so it neither marks the
// ping released nor forgets the state it reported (release passes 0), and
// the track keeps the ignition the backend never got. Another request of
// the asset was accepted meanwhile (an alarm), so the retry of the
// ignition, late beside it at a settled stay, is judged no change and
// suppressed: the sender is told 200, and the backend never learns the
// ignition went on. Without the eviction the same sequence admits the
// retry (state forgotten). The eviction needs max_keys new keys while the
// request is in flight: a burst, or simply the other site of the process
// inserting while this site's keys, under a shorter ttl, are the closest
// to expiry (TestAFullMemoryStoreDoesNotEvictAnotherSitesClaimInFlight).
func TestAnEvictedSeenEntryInFlightDoesNotLoseItsStateChange(t *testing.T) {
	at := time.Now().UTC().Add(-10 * time.Minute).Truncate(time.Minute)
	pingOf := func(asset string, offset time.Duration, lat, lon float64, extra string) string {
		return fmt.Sprintf(`{"asset_id":%q,"occurred_at":%q,"lat":%v,"lon":%v%s}`, asset, at.Add(offset).Format(time.RFC3339), lat, lon, extra)
	}
	for _, tc := range []struct {
		name string
		// ttl is the car's site's; other is what inserts while the
		// ignition is in flight: nothing, a burst of the same site, or
		// the process's other site (default ttl, tumbling).
		ttl, other string
		maxKeys    int
	}{
		{"no eviction", "", "", 6},
		{"a burst of max_keys new keys", "", "burst", 6},
		{"another site with a longer ttl inserting", `,"ttl":"10m"`, "other site", 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := dedup.NewMemoryStore(tc.maxKeys)
			prefix := strings.ReplaceAll(tc.name, " ", "-")
			h := tableHandler(t, fmt.Sprintf(`{"key_prefix":"evict-seen-%s:","shape":"sliding","state":["ignition"],"event":["alarm"]%s}`, prefix, tc.ttl))
			h.h.deduper.Store = store
			other := tableHandler(t, fmt.Sprintf(`{"key_prefix":"evict-seen-other-%s:"}`, prefix))
			other.h.deduper.Store = store
			if tc.other == "other site" { // the other site's keys, older than the car's
				for i := range 2 {
					if res := other.post(pingOf(fmt.Sprintf("older-%d", i), 0, 48.1, 11.6, ""), "application/json", nil); res.status != http.StatusCreated {
						t.Fatalf("older ping %d: %d %s", i, res.status, res.body)
					}
				}
			}
			for i, off := range []time.Duration{0, 10 * time.Second, 20 * time.Second} { // parked: a settled stay
				if res := h.post(pingOf("car", off, 52.5200087+float64(i)*0.000003, 13.4049547, ""), "application/json", nil); res.status >= 300 {
					t.Fatalf("parked fix %d: %d %s", i, res.status, res.body)
				}
			}
			ignition := pingOf("car", 30*time.Second, 52.5200100, 13.4049560, `,"ignition":true`)
			// The ignition's request waits for its upstream, which then fails.
			fail := make(chan struct{})
			done := make(chan int)
			go func() {
				r := httptest.NewRequest(http.MethodPost, "/telemetry", strings.NewReader(ignition))
				r.Header.Set("Content-Type", "application/json")
				r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddyhttp.NewTestReplacer(r)))
				w := httptest.NewRecorder()
				_ = h.h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
					<-fail
					w.WriteHeader(http.StatusBadGateway)
					return nil
				}))
				done <- w.Code
			}()
			waitFor(t, func() bool { return inFlightNow(t) > 0 })
			// Another request of the car, accepted and delivered meanwhile.
			if res := h.post(pingOf("car", 40*time.Second, 52.5200090, 13.4049550, `,"alarm":"sos"`), "application/json", nil); res.status != http.StatusCreated {
				t.Fatalf("the alarm: %d %s", res.status, res.body)
			}
			switch tc.other { // new keys while the ignition is in flight
			case "burst":
				for i := range 2 { // two keys each (track and seen entry): the four oldest go, the ignition's entry last
					if res := h.post(pingOf(fmt.Sprintf("other-%d", i), 0, 48.1, 11.6, ""), "application/json", nil); res.status != http.StatusCreated {
						t.Fatalf("other ping %d: %d %s", i, res.status, res.body)
					}
				}
			case "other site":
				for i := range 4 { // one key each; the car's, under ttl 10m, are the closest to expiry
					if res := other.post(pingOf(fmt.Sprintf("newer-%d", i), 0, 48.1, 11.6, ""), "application/json", nil); res.status != http.StatusCreated {
						t.Fatalf("newer ping %d: %d %s", i, res.status, res.body)
					}
				}
			}
			close(fail)
			if code := <-done; code != http.StatusBadGateway {
				t.Fatalf("the ignition's request: %d, want the upstream's 502", code)
			}
			res := h.post(ignition, "application/json", nil)
			if got := res.header.Get("X-Dedup"); got != "accepted" {
				t.Errorf("the retry of the ignition the backend refused got %d %s (%s): the sender drops it, and the backend never hears the ignition went on",
					res.status, got, res.header.Get("X-Dedup-Reason"))
			}
		})
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
	}
}

// A reload to a config that uses the memory store nowhere (a trial of the
// redis store, the directive taken out for a while) and one back is no
// restart: the store must come back with its claims, or every redelivery
// of the last TTL is delivered again. Dropped with the usage pool, it
// came back empty (helper 3's finding).
func TestTheMemoryStoreOutlivesAConfigWithoutIt(t *testing.T) {
	body := fmt.Sprintf(`{"asset_id":"veh-idle","occurred_at":%q,"lat":52.52,"lon":13.4}`,
		time.Now().UTC().Add(-time.Minute).Truncate(time.Second).Format(time.RFC3339))
	const config = `{"key_prefix":"idle-memory:"}`
	first, unloadFirst := loadConfig(t, config)
	if res := first.post(body, "application/json", nil); res.status != http.StatusCreated {
		t.Fatalf("first sighting: %d %s", res.status, res.body)
	}
	unloadFirst() // the config without it is loaded: no handler holds the store
	again, unloadAgain := loadConfig(t, config)
	defer unloadAgain()
	if res := again.post(body, "application/json", nil); res.header.Get("X-Dedup") != "suppressed" {
		t.Fatalf("the redelivery after a reload through a config without the memory store: %d %s, want suppressed",
			res.status, res.header.Get("X-Dedup"))
	}
}

// The store no config uses is held for an hour at least, and then until
// the keys it holds have expired, counting those that requests of the
// config that let go of it claimed meanwhile (helper 5's finding: held
// by the expiry of what it held when let go of, an empty store was dropped
// at once, and a claim a slow upload made after that went with it). A
// process that no longer uses it holds nothing for good.
func TestAnIdleMemoryStoreIsLetGoOfOnceItsKeysHaveExpired(t *testing.T) {
	idle := idleStore{hold: 200 * time.Millisecond}
	held := &memoryStoreValue{MemoryStore: dedup.NewMemoryStore(10), bounds: map[int]int{}}
	claim := func(key string, ttl time.Duration) {
		c := &dedup.Claim{Observation: dedup.Observation{Key: key}, Policy: &dedup.Policy{Shape: dedup.Tumbling, TTL: ttl},
			Token: 1, At: time.Now()}
		if _, err := held.Decide(context.Background(), []*dedup.Claim{c}); err != nil {
			t.Fatal(err)
		}
	}
	idle.keep(held) // empty
	claim("idle-test:late", 600*time.Millisecond)
	time.Sleep(400 * time.Millisecond) // past the hold, within the late claim's TTL
	if got := idle.take(); got != held {
		t.Fatalf("took %p while a claim made after it was let go of still stands, want the store kept (%p)", got, held)
	}
	idle.keep(held)
	time.Sleep(time.Second)
	if got := idle.take(); got != nil {
		t.Fatalf("after its hold and its last key's expiry, the idle store is still held")
	}
}

// gatedBody is a request body that a slow sender is still uploading: it
// gives nothing until open is closed.
type gatedBody struct {
	open <-chan struct{}
	r    io.Reader
}

func (b *gatedBody) Read(p []byte) (int, error) {
	<-b.open
	return b.r.Read(p)
}

// A request the old config took before a reload, whose body was still on
// its way (a phone on a slow link), is decided after the old config let
// go of the memory store: its claim lands in the idle store, which is
// held for it (helper 5's finding: held only by the keys it had when let
// go of, none here, it was dropped with the claim, and the retry after the
// reload back was delivered again).
func TestAClaimTheOldConfigMadeAfterItLetGoSurvivesTheTripBack(t *testing.T) {
	body := fmt.Sprintf(`{"asset_id":"veh-late","occurred_at":%q,"lat":52.52,"lon":13.4}`,
		time.Now().UTC().Add(-time.Minute).Truncate(time.Second).Format(time.RFC3339))
	const config = `{"key_prefix":"late-claim:"}`
	old, unloadOld := loadConfig(t, config)

	open := make(chan struct{})
	r := httptest.NewRequest(http.MethodPost, "/telemetry", &gatedBody{open: open, r: strings.NewReader(body)})
	r.ContentLength = int64(len(body))
	r.Header.Set("Content-Type", "application/json")
	repl := caddyhttp.NewTestReplacer(r)
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	w := httptest.NewRecorder()
	forwarded := 0
	done := make(chan error, 1)
	go func() {
		done <- old.h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			forwarded++
			w.WriteHeader(http.StatusCreated)
			return nil
		}))
	}()

	unloadOld() // the reload to a config without the memory store (a trial of redis) goes through
	close(open) // the body arrives; the old handler decides it
	if err := <-done; err != nil || w.Code != http.StatusCreated || forwarded != 1 {
		t.Fatalf("the in-flight ping: %d %v (forwarded %d), want it accepted and forwarded", w.Code, err, forwarded)
	}
	time.Sleep(100 * time.Millisecond)

	again, unloadAgain := loadConfig(t, config) // and back
	defer unloadAgain()
	if res := again.post(body, "application/json", nil); res.header.Get("X-Dedup") != "suppressed" {
		t.Fatalf("the retry of the ping the old config accepted during the reload: %d %s, want suppressed "+
			"(the idle store was let go of with its claim)", res.status, res.header.Get("X-Dedup"))
	}
}
