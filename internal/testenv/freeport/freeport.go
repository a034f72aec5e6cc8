// Package freeport hands out TCP ports of 127.0.0.1 for the processes that the tests, the
// bench and `make run` start (kube-apiserver, etcd, PostgreSQL, the node's components,
// the controller's servers). It imports nothing beyond the standard library, so that a
// package built with the race detector (internal/registry's tests, through pgtest)
// does not compile client-go's tree again for it.
package freeport

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Get returns a TCP port of 127.0.0.1 that was free a moment ago, and that this
// process has not handed out before. It is picked at random from 20000 to 29999, below
// the ports that the kernel hands to outgoing connections (net.ipv4.ip_local_port_range,
// 32768 to 60999 by default) and to NodePorts (30000 to 32767): a port the kernel picks
// itself, as a listener on port 0 gets, is from that range, and any connection opened
// between the pick and the moment a process binds the port may take it (kube-apiserver
// failed to start so, "bind: address already in use"). The processes of one test run
// (go test runs a process per package) never hand out the same port: each holds a lock
// on the port's byte of one file (portLocks) for as long as it lives.
func Get() (int, error) {
	low, high := portsFrom, portsTo
	if first := ephemeralPortsFrom(); first <= high {
		high = first - 1
	}
	if low > high {
		// The kernel hands out every port from 20000 on: take one from it.
		return kernelPort()
	}
	for range 1000 {
		port := low + rand.IntN(high-low+1) // #nosec G404 -- a port, not a secret
		handedOutMu.Lock()
		taken := handedOut[port]
		handedOut[port] = true // held while it is tried
		handedOutMu.Unlock()
		if taken {
			continue
		}
		if !lockPort(port) {
			continue // another process handed it out; it stays in handedOut, not ours to try
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // in use; locked and in handedOut, so it is not tried again
		}
		_ = l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free port of 127.0.0.1 from %d to %d", low, high)
}

// portLocks is the file whose byte at offset PORT a process locks (an fcntl record
// lock, F_SETLK) when it hands out PORT. The kernel lets go of a process's locks when
// it ends, however it ends, so nothing needs to clean them up; the empty file stays.
var portLocks struct {
	once sync.Once
	f    *os.File
}

// lockPort locks port's byte of portLocks for this process: false when another process
// holds it. Where the file cannot be opened it says true: the ports are then picked as
// if by one process alone.
func lockPort(port int) bool {
	f := lockFile()
	if f == nil {
		return true
	}
	lock := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart, Start: int64(port), Len: 1}
	return syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lock) == nil
}

// lockFile is portLocks' file, opened on first use; nil where it cannot be opened.
func lockFile() *os.File {
	portLocks.once.Do(func() {
		f, err := os.OpenFile(filepath.Join(os.TempDir(), "student-controller-test-ports.lock"), os.O_RDWR|os.O_CREATE, 0o600)
		if err == nil {
			portLocks.f = f
		}
	})
	return portLocks.f
}

// kernelPort is a port that the kernel picked for a listener, free a moment ago.
func kernelPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// The ports Get picks from (variables for TestGetAcrossProcesses).
var portsFrom, portsTo = 20000, 29999

var (
	handedOutMu sync.Mutex
	handedOut   = map[int]bool{}
)

// ephemeralPortsFrom is the first port that the kernel hands to outgoing connections
// (32768 when it cannot tell).
func ephemeralPortsFrom() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 32768
	}
	port, err := strconv.Atoi(fields[0])
	if err != nil {
		return 32768
	}
	return port
}

// Addr returns 127.0.0.1:PORT for a port that was free a moment ago.
func Addr() (string, error) {
	port, err := Get()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", port), nil
}
