package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeRoot is a checkout whose hack/build-controlplane.sh is script.
func fakeRoot(t *testing.T, script string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "hack"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "hack", "build-controlplane.sh"), []byte("#!/bin/sh\n"+script+"\n"), 0o700); err != nil { // #nosec G306 -- a script to run
		t.Fatal(err)
	}
	return root
}

// building starts the build of a checkout whose hack/build-controlplane.sh is script,
// and stops it when the test ends.
func building(t *testing.T, ctx context.Context, script, state string) *laterControllerManager {
	t.Helper()
	l, err := buildControllerManager(ctx, fakeRoot(t, script), state)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.stop)
	return l
}

// fakeControlPlane counts the starts of kube-controller-manager.
type fakeControlPlane struct {
	mu     sync.Mutex
	starts int
}

func (f *fakeControlPlane) StartControllerManager() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts++
	return nil
}

func (f *fakeControlPlane) ControllerManagerLog() string { return "kube-controller-manager.log" }

func (f *fakeControlPlane) started() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts
}

// within polls cond for up to 10 s.
func within(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLaterControllerManager: kube-controller-manager starts at once when the build
// has nothing to do, once built otherwise, never after its build failed or was
// stopped; and stopping (or Ctrl-C) ends the build with everything it started.
func TestLaterControllerManager(t *testing.T) {
	t.Run("up to date", func(t *testing.T) {
		l := building(t, t.Context(), "exit 0", t.TempDir())
		<-l.exited
		cp := &fakeControlPlane{}
		if started, err := l.start(cp); !started || err != nil || cp.started() != 1 {
			t.Errorf("start = %v, %v with %d starts; want started at once", started, err, cp.started())
		}
	})
	t.Run("failed at once", func(t *testing.T) {
		l := building(t, t.Context(), "exit 3", t.TempDir())
		<-l.exited
		cp := &fakeControlPlane{}
		if _, err := l.start(cp); err == nil || cp.started() != 0 {
			t.Errorf("start: %v with %d starts; want the build's failure and none", err, cp.started())
		}
	})
	t.Run("built while the rest starts", func(t *testing.T) {
		l := building(t, t.Context(), "sleep 1", t.TempDir())
		cp := &fakeControlPlane{}
		if started, err := l.start(cp); started || err != nil {
			t.Fatalf("start = %v, %v; want it left to the build's end", started, err)
		}
		within(t, "kube-controller-manager started once built", func() bool { return cp.started() == 1 })
	})
	t.Run("failed while the rest starts", func(t *testing.T) {
		l := building(t, t.Context(), "sleep 1; exit 3", t.TempDir())
		cp := &fakeControlPlane{}
		if started, err := l.start(cp); started || err != nil {
			t.Fatalf("start = %v, %v; want it left to the build's end", started, err)
		}
		<-l.exited
		l.stop() // waits for the decision
		if cp.started() != 0 {
			t.Error("kube-controller-manager started after its build failed")
		}
	})

	// A build that runs a child of its own, as the script runs go build: stopping it,
	// or Ctrl-C, ends both, and nothing starts after.
	for _, how := range []string{"stop", "Ctrl-C"} {
		t.Run(how+" while building", func(t *testing.T) {
			state := t.TempDir()
			pidFile := filepath.Join(state, "child.pid")
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			l := building(t, ctx, "sleep 60 & echo $! > "+pidFile+"; wait", state)
			cp := &fakeControlPlane{}
			if started, err := l.start(cp); started || err != nil {
				t.Fatalf("start = %v, %v; want it left to the build's end", started, err)
			}
			var child int
			within(t, "the build's child started", func() bool {
				b, err := os.ReadFile(pidFile) // #nosec G304 -- the test's own file
				child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
				return err == nil && child > 0
			})
			if how == "stop" {
				l.stop()
			} else {
				cancel()
			}
			within(t, "the build ended", func() bool {
				select {
				case <-l.exited:
					return true
				default:
					return false
				}
			})
			within(t, "the build's child ended", func() bool { return gone(child) })
			l.stop()
			if cp.started() != 0 {
				t.Error("kube-controller-manager started after its build was stopped")
			}
		})
	}
}

// gone says whether process pid has ended: no such process, or one that only waits to
// be reaped.
func gone(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat")) // #nosec G304 -- procfs
	if err != nil {
		return true
	}
	_, after, _ := strings.Cut(string(stat), ") ")
	return strings.HasPrefix(after, "Z")
}
