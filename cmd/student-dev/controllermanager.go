package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/student-controller/student-controller/internal/testenv/controlplane"
)

// laterControllerManager builds kube-controller-manager while the rest starts, and
// starts it once built. make run builds etcd and kube-apiserver before student-dev, and
// nothing it shows a newcomer first needs the controller manager (it deletes namespaces
// and collects garbage): on a fresh machine its compile no longer holds up the start.
// hack/build-controlplane.sh returns at once when bin/k8s has it up to date, and then it
// starts with the rest, as before.
type laterControllerManager struct {
	log    string
	build  *exec.Cmd
	exited chan struct{} // closed once the build has ended, with err set
	err    error

	mu      sync.Mutex
	stopped bool
	started chan struct{} // closed once start's background start has ended
}

// buildControllerManager starts building kube-controller-manager into bin/k8s, its
// output in the state folder.
func buildControllerManager(root, state string) (*laterControllerManager, error) {
	l := &laterControllerManager{log: filepath.Join(state, "kube-controller-manager-build.log"), exited: make(chan struct{})}
	out, err := os.Create(l.log)
	if err != nil {
		return nil, err
	}
	// Not tied to the context that Ctrl-C ends: stop ends it, and says nothing of it.
	l.build = exec.Command(filepath.Join(root, "hack", "build-controlplane.sh"), "kube-controller-manager") // #nosec G204 -- our own script
	l.build.Dir = root
	l.build.Stdout, l.build.Stderr = out, out
	// Its own process group, so that stopping it stops the go build under it too.
	l.build.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := l.build.Start(); err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("build kube-controller-manager: %w", err)
	}
	go func() {
		l.err = l.build.Wait()
		_ = out.Close()
		close(l.exited)
	}()
	return l, nil
}

// start starts kube-controller-manager on env now if it is built, and reports whether
// it did; otherwise it starts it in the background once built, and says so then.
func (l *laterControllerManager) start(env *controlplane.Env) (bool, error) {
	select {
	case <-l.exited:
		if l.err != nil {
			return false, fmt.Errorf("build kube-controller-manager (its output: %s): %w", l.log, l.err)
		}
		return true, env.StartControllerManager()
	default:
	}
	l.started = make(chan struct{})
	go func() {
		defer close(l.started)
		<-l.exited
		l.mu.Lock()
		defer l.mu.Unlock()
		switch {
		case l.stopped:
		case l.err != nil:
			say("kube-controller-manager did not build (its output: %s): %v; the rest runs on without it", l.log, l.err)
		default:
			if err := env.StartControllerManager(); err != nil {
				say("kube-controller-manager did not start: %v; the rest runs on without it", err)
				return
			}
			say("kube-controller-manager built and started (logs to %s)", env.ControllerManagerLog())
		}
	}()
	return false, nil
}

// stop ends the build if it still runs and keeps kube-controller-manager from starting
// after it returns: call it before the control plane stops.
func (l *laterControllerManager) stop() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	select {
	case <-l.exited:
	default:
		_ = syscall.Kill(-l.build.Process.Pid, syscall.SIGKILL)
		<-l.exited
	}
	if l.started != nil {
		<-l.started
	}
}
