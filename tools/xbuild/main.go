// Command xbuild builds Caddy with telemetry_dedup from this checkout, as
// pinned in xcaddy.json, and optionally runs it:
//
//	go run ./tools/xbuild                                   # builds ./caddy
//	go run ./tools/xbuild run --config Caddyfile.example    # builds, then ./caddy run ...
//	go run ./tools/xbuild -o /usr/local/bin/caddy           # builds elsewhere
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/telemetry-dedup/caddy-telemetry-dedup/internal/xbuild"
)

func main() {
	output := flag.String("o", "caddy", "where to write the Caddy binary")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: go run ./tools/xbuild [-o caddy] [caddy arguments...]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*output, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "xbuild:", err)
		os.Exit(1)
	}
}

func run(output string, caddyArgs []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	recipe, err := xbuild.Load(".")
	if err != nil {
		return fmt.Errorf("%v (run it from the repository root)", err)
	}
	build, err := recipe.Command(ctx, ".", output)
	if err != nil {
		return err
	}
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	fmt.Fprintf(os.Stderr, "xbuild: building Caddy %s with %s (CGO_ENABLED=1) into %s\n", recipe.CaddyVersion, recipe.Module, output)
	if err := build.Run(); err != nil {
		return fmt.Errorf("xcaddy build failed: %v (cgo needs a C compiler such as gcc)", err)
	}
	if len(caddyArgs) == 0 {
		return nil
	}
	binary, err := filepath.Abs(output) // a bare "caddy" would be looked up on PATH
	if err != nil {
		return err
	}
	caddy := exec.CommandContext(ctx, binary, caddyArgs...)
	caddy.Stdin, caddy.Stdout, caddy.Stderr = os.Stdin, os.Stdout, os.Stderr
	caddy.Cancel = func() error { return caddy.Process.Signal(os.Interrupt) } // let Caddy shut down gracefully
	err = caddy.Run()
	if ctx.Err() != nil && caddy.ProcessState != nil && caddy.ProcessState.Success() {
		return nil // stopped with Ctrl-C, and Caddy shut down cleanly: Run reports the cancellation as an error
	}
	return err
}
