// Package testproc holds what the tests that run processes (the controller, the
// local control plane, PostgreSQL) share: addresses to give them and a place for
// what they print.
package testproc

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
)

// FreePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreeAddr returns 127.0.0.1:PORT for a port that was free a moment ago.
func FreeAddr() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", port), nil
}

// Addr is FreeAddr for a test, which it fails when no port is free.
func Addr(tb testing.TB) string {
	tb.Helper()
	addr, err := FreeAddr()
	if err != nil {
		tb.Fatalf("find a free port: %v", err)
	}
	return addr
}

// Output collects what a process writes while the test reads it.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// Tail returns the last lines of out, for an error that shows where a process's log
// ends.
func Tail(out []byte, lines int) string {
	all := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}
