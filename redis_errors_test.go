package telemetrydedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/dedup"
	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/redistest"
)

// A store error names the fix when Redis says what is wrong: a real Redis
// at maxmemory, or one that wants a password, as the store's calls see it
// (wrapped on the way).
func TestStoreErrorsSayWhatToDo(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	ctx := context.Background()
	if err := client.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	oom := client.Set(ctx, "k", "v", 0).Err()
	client.ConfigSet(ctx, "maxmemory", "0")
	if err := client.ConfigSet(ctx, "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	noauth := srv.Client().Set(ctx, "k", "v", 0).Err() // a new client, without the password
	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		{"out of memory", fmt.Errorf("%w: %w", dedup.ErrReleasesOwed, oom), "maxmemory"},
		{"no password", noauth, "set password"},
		{"a timeout", fmt.Errorf("decide: %w", context.DeadlineExceeded), "within the store's timeout"},
		{"anything else", errors.New("connection reset by peer"), ""},
	} {
		if fix := storeErrorFix(tt.err); (tt.want == "") != (fix == "") || !strings.Contains(fix, tt.want) {
			t.Errorf("%s (%v): fix %q, want one saying %q", tt.name, tt.err, fix, tt.want)
		}
	}
}
