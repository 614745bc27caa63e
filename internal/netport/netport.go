// Package netport picks the loopback TCP ports that strata's servers
// listen on, below the kernel's ephemeral port range.
//
// A port in that range that is free when picked can become the local
// port of an outgoing connection (a safekeeper reconnecting to Postgres,
// a gRPC client) while its server is down, and the server's restart then
// fails with "address already in use": seen in CI with a test safekeeper,
// and with `strata up` on Postgres' old default port 55432 after a crash.
package netport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Floor is the lowest port Block returns (below it are well-known
// services and many a developer's own servers).
const Floor = 10000

// EphemeralRange is the kernel's range of local ports for outgoing
// connections (net.ipv4.ip_local_port_range; Linux's default 32768-60999
// when it cannot be read).
func EphemeralRange() (lo, hi int) {
	lo, hi = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	l, err1 := strconv.Atoi(f[0])
	h, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || l <= 0 || h < l {
		return lo, hi
	}
	return l, h
}

// Ephemeral reports whether port lies in the kernel's ephemeral range.
func Ephemeral(port int) bool {
	lo, hi := EphemeralRange()
	return port >= lo && port <= hi
}

// Block returns the first of n consecutive ports that are free on
// 127.0.0.1 now, between Floor and the ephemeral range, starting the
// search at a random place.
func Block(n int) (int, error) {
	lo, _ := EphemeralRange()
	top := min(lo, 65536) - n // the last base that fits below the range
	if top <= Floor {
		return 0, fmt.Errorf("netport: no room for %d ports between %d and the ephemeral range at %d", n, Floor, lo)
	}
	start := Floor + rand.IntN(top-Floor)
	for i := range top - Floor {
		base := Floor + (start-Floor+i)%(top-Floor)
		if free(base, n) {
			return base, nil
		}
	}
	return 0, fmt.Errorf("netport: no %d consecutive free ports between %d and %d", n, Floor, lo)
}

// free reports whether ports base..base+n-1 can all be listened on now.
func free(base, n int) bool {
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// Claim keeps port from every other process that claims it until release
// is called or this process ends (a kill -9 included): a lock on a file
// named after the port in a folder of the temporary directory. It
// reports false when another live process holds it.
//
// Test binaries run at once (`go test ./...`) pick ports on their own;
// a port one of them picked and has not listened on yet is free to the
// others' listen check. A server's client that dials the port in that
// window (a test safekeeper polls Postgres' port while initdb runs) then
// reaches another test's server: seen as safekeepers that took another
// cluster's system identifier and never streamed. Claiming closes that.
func Claim(port int) (release func(), ok bool) {
	dir := filepath.Join(os.TempDir(), "strata-test-ports")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return func() {}, true // no folder to lock in: the listen check alone
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return func() {}, true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return func() { f.Close() }, true
}

// Take claims port (Claim) and checks that it can be listened on now; it
// reports false, holding nothing, when either fails.
func Take(port int) (release func(), ok bool) {
	release, ok = Claim(port)
	if !ok {
		return nil, false
	}
	if !free(port, 1) {
		release()
		return nil, false
	}
	return release, true
}
