package testenv

import (
	"testing"
)

// TestFreePort: the ports handed out are free, not handed out twice, and never from the
// range the kernel picks from for outgoing connections and for a listener on port 0,
// where any connection could take one before its process binds it.
func TestFreePort(t *testing.T) {
	first := ephemeralPortsFrom()
	seen := map[int]bool{}
	for range 200 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port >= first {
			t.Fatalf("FreePort() = %d, in the kernel's range of ports for outgoing connections (from %d)", port, first)
		}
		if port >= 30000 && port <= 32767 {
			t.Fatalf("FreePort() = %d, a NodePort", port)
		}
		if seen[port] {
			t.Fatalf("FreePort() handed out %d twice", port)
		}
		seen[port] = true
	}
}
