package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
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

	// mu is held while a start is decided and made; deciding counts the background
	// start that waits for the build, which stop waits for, so that once it returns
	// no start is under way and none is to come.
	mu       sync.Mutex
	stopped  bool
	deciding sync.WaitGroup
}

// controllerManagerStarter is the control plane that the built kube-controller-manager
// joins (*controlplane.Env).
type controllerManagerStarter interface {
	StartControllerManager() error
	ControllerManagerLog() string
}

// buildControllerManager starts root's hack/build-controlplane.sh kube-controller-manager,
// its output in the state folder. The build runs in a process group of its own, which
// stop, or ctx ending (Ctrl-C), kills whole (the go build under the script too);
// nothing is said of a build ended so.
func buildControllerManager(ctx context.Context, root, state string) (*laterControllerManager, error) {
	l := &laterControllerManager{log: filepath.Join(state, "kube-controller-manager-build.log"), exited: make(chan struct{})}
	out, err := os.Create(l.log)
	if err != nil {
		return nil, err
	}
	l.build = exec.Command(filepath.Join(root, "hack", "build-controlplane.sh"), "kube-controller-manager") // #nosec G204 -- our own script
	l.build.Dir = root
	l.build.Stdout, l.build.Stderr = out, out
	// The script dies with student-dev even when student-dev is killed outright.
	l.build.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := l.build.Start(); err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("build kube-controller-manager: %w", err)
	}
	go func() {
		l.err = l.build.Wait()
		_ = out.Close()
		close(l.exited)
	}()
	go func() {
		select {
		case <-ctx.Done():
			l.stop()
		case <-l.exited:
		}
	}()
	return l, nil
}

// start starts kube-controller-manager on env now if it is built, and reports whether
// it did; otherwise it starts it in the background once built, and says so then.
func (l *laterControllerManager) start(env controllerManagerStarter) (bool, error) {
	select {
	case <-l.exited:
		if l.err != nil {
			return false, fmt.Errorf("build kube-controller-manager (its output: %s): %w", l.log, l.err)
		}
		return true, env.StartControllerManager()
	default:
	}
	l.mu.Lock() // stop, once it has set stopped, waits for what is added here
	defer l.mu.Unlock()
	if l.stopped {
		return false, nil
	}
	l.deciding.Go(func() {
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
	})
	return false, nil
}

// stop ends the build if it still runs, and keeps kube-controller-manager from starting
// once it returns; it waits for a start under way. Call it before the control plane
// stops; calling it again does nothing more.
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
	l.deciding.Wait()
}
