package freeport

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Ports are never handed out twice, even when the kernel offers one again.
func TestPickNeverReturnsAPortTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 2000 {
		port, err := Pick()
		if err != nil {
			t.Fatal(err)
		}
		if seen[port] {
			t.Fatalf("port %d handed out twice", port)
		}
		seen[port] = true
	}
}

// Test processes run side by side (go test ./... runs a process a
// package), and a port one of them picked stays its own while the process
// lives: a server it stopped may have a client left that retries it (a
// Redis connection whose reconciler still owes releases, for up to 101 s),
// and another process's server on that port would answer it and count in
// that client's metrics. So no process picks a port another live process
// has picked.
func TestPickNeverReturnsAPortAnotherProcessPicked(t *testing.T) {
	const n = 1000
	mine := map[int]bool{}
	for range n {
		port, err := Pick()
		if err != nil {
			t.Fatal(err)
		}
		mine[port] = true
	}
	cmd := exec.Command(os.Args[0]) // TestMain picks and prints, running no test
	cmd.Env = append(os.Environ(), "FREEPORT_CHILD="+strconv.Itoa(n))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the other process: %v", err)
	}
	var shared []string
	for _, field := range strings.Fields(string(out)) {
		if port, err := strconv.Atoi(field); err == nil && mine[port] {
			shared = append(shared, field)
		}
	}
	if len(shared) > 0 {
		t.Fatalf("another process was handed %d of the %d ports this one picked: %v", len(shared), n, shared)
	}
}

// TestMain is the other process of
// TestPickNeverReturnsAPortAnotherProcessPicked when FREEPORT_CHILD says
// how many ports to pick: it prints them.
func TestMain(m *testing.M) {
	if n, err := strconv.Atoi(os.Getenv("FREEPORT_CHILD")); err == nil {
		for range n {
			port, err := Pick()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			fmt.Println(port)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
