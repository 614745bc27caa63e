package netport

import (
	"net"
	"strconv"
	"testing"
)

func TestBlockBelowEphemeral(t *testing.T) {
	lo, hi := EphemeralRange()
	if lo <= 0 || hi < lo {
		t.Fatalf("range %d-%d", lo, hi)
	}
	for range 20 {
		base, err := Block(5)
		if err != nil {
			t.Fatal(err)
		}
		if base < Floor || base+5 > lo || Ephemeral(base) || Ephemeral(base+4) {
			t.Fatalf("block %d..%d: want it between %d and the ephemeral range at %d", base, base+4, Floor, lo)
		}
		for p := base; p < base+5; p++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				t.Fatalf("port %d of the block is not free: %v", p, err)
			}
			l.Close()
		}
	}
	if !Ephemeral(lo) || !Ephemeral(hi) || Ephemeral(lo-1) {
		t.Fatalf("Ephemeral disagrees with the range %d-%d", lo, hi)
	}
}

// TestBlockSkipsTakenPorts: a block never includes a port in use.
func TestBlockSkipsTakenPorts(t *testing.T) {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range 30 {
		base, err := Block(3)
		if err != nil {
			t.Fatal(err)
		}
		for p := base; p < base+3; p++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				t.Fatalf("Block returned %d..%d, but %d is taken: %v", base, base+2, p, err)
			}
			held = append(held, l) // keep them: the next blocks must avoid them
		}
	}
}
