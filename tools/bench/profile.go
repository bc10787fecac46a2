package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// profiling is a CPU profile of Caddy to take under one variant's load.
type profiling struct {
	variant variant
	out     string
	seconds int
}

// take loads the variant's site while Caddy's admin endpoint
// (/debug/pprof/profile) profiles the whole process, and writes the profile
// to p.out. The load runs a second longer than the profile on each side, so
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
	fmt.Fprintf(os.Stderr, "profile of Caddy under %q (%.0f req/s, %d requests) written to %s: go tool pprof -top %s\n",
		p.variant.label, res.rps, res.requests, p.out, p.out)
	return nil
}

func (p *profiling) fetch(adminURL string) error {
	res, err := http.Get(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", adminURL, p.seconds))
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
