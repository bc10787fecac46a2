package freeport

import "testing"

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
