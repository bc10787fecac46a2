package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// profiling is a profile of Caddy to take under one variant's load.
type profiling struct {
	variant variant
	kind    string // one of profileKinds
	out     string
	seconds int
}

// profileKinds are the profiles -profile-kind takes, each named as Caddy's
// admin endpoint serves it under /debug/pprof/: "cpu" is its "profile";
// "allocs" is read as a delta over the load (its seconds parameter), so it
// holds only what the variant's requests allocated.
var profileKinds = []string{"cpu", "allocs"}

// endpoint is the profile's path under /debug/pprof/.
func (p *profiling) endpoint() string {
	if p.kind == "cpu" {
		return "profile"
	}
	return p.kind
}

// take loads the variant's site while Caddy's admin endpoint
// (/debug/pprof/) profiles the whole process, and writes the profile to
// p.out. The load runs a second longer than the profile on each side, so
// that the profile sees nothing but load.
func (p *profiling) take(adminURL, siteURL string, conns int, round uint64) error {
	profiled := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		profiled <- p.fetch(adminURL)
	}()
	res := load(siteURL, p.variant.bodies, conns, time.Duration(p.seconds+2)*time.Second, round)
	if err := <-profiled; err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%s profile of Caddy under %q (%.0f req/s: about %.0f requests in its %d s) written to %s: go tool pprof -top %s\n",
		p.kind, p.variant.label, res.rps, res.rps*float64(p.seconds), p.seconds, p.out, p.out)
	return nil
}

func (p *profiling) fetch(adminURL string) error {
	res, err := http.Get(fmt.Sprintf("%s/debug/pprof/%s?seconds=%d", adminURL, p.endpoint(), p.seconds))
	if err != nil {
		return fmt.Errorf("profiling Caddy: %v", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("profiling Caddy: its admin endpoint answered %s", res.Status)
	}
	f, err := os.Create(p.out)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, res.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
