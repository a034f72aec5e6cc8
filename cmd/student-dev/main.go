// Command student-dev runs the whole system on one machine with no cluster: a real
// etcd, kube-apiserver and kube-controller-manager from bin/k8s, the Student CRD, the
// sample Students, and student-controller on a SQLite file, until Ctrl-C. `make run`
// builds and starts it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/student-controller/student-controller/internal/testenv/controlplane"
)

func main() {
	stateDir := flag.String("state-dir", ".local", "Folder for the local state: etcd data, kubeconfig, registry file.")
	controllerBin := flag.String("controller", "bin/student-controller", "The student-controller binary to run.")
	probeAddr := flag.String("health-probe-bind-address", "127.0.0.1:8081", "Passed to the controller; also polled for readiness.")
	metricsAddr := flag.String("metrics-bind-address", "127.0.0.1:8080", "Passed to the controller.")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: student-dev [flags] [-- controller flags]\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *stateDir, *controllerBin, *probeAddr, *metricsAddr, flag.Args()); err != nil {
		fmt.Fprintf(os.Stderr, "student-dev: %v\n", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

func run(ctx context.Context, stateDir, controllerBin, probeAddr, metricsAddr string, extra []string) (err error) {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	state, err := filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		return err
	}
	kubeconfig := filepath.Join(state, "kubeconfig")
	registryFile := filepath.Join(state, "student-registry.db")

	say("Starting the local control plane from bin/k8s: etcd, kube-apiserver, and kube-controller-manager running %s (data in %s)",
		strings.Join(controlplane.Controllers, " and "), state)
	env, err := controlplane.Start(controlplane.Options{
		Root: root, EtcdDataDir: filepath.Join(state, "etcd"), Kubeconfig: kubeconfig, LogDir: state,
	})
	if err != nil {
		return err
	}
	defer func() {
		say("Stopping the control plane")
		err = errors.Join(err, env.Stop())
		if err == nil {
			say("Stopped; the state stays in %s for the next run", state)
		}
	}()
	say("Control plane up (kube-controller-manager logs to %s); the Student CRD and the admission policy that adds its finalizer are installed", env.ControllerManagerLog())

	say("Applying the sample Students (config/samples)")
	apply := exec.CommandContext(ctx, "kubectl", "--kubeconfig", kubeconfig, "apply", "-k", filepath.Join(root, "config", "samples"))
	apply.Stdout, apply.Stderr = os.Stdout, os.Stderr
	if err := apply.Run(); err != nil {
		return fmt.Errorf("kubectl apply -k config/samples: %w", err)
	}

	say("Starting student-controller on the registry %s", registryFile)
	args := append([]string{
		"--kubeconfig", kubeconfig,
		"--registry", "sqlite://" + registryFile,
		"--health-probe-bind-address", probeAddr,
		"--metrics-bind-address", metricsAddr,
		"--sweep-interval", "1m",
	}, extra...)
	ctrl := exec.Command(controllerBin, args...)
	ctrl.Stdout, ctrl.Stderr = os.Stdout, os.Stderr
	// Its own process group, so that Ctrl-C reaches it only through us, after which
	// we wait for it to drain; and it dies with us if we are killed.
	ctrl.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := ctrl.Start(); err != nil {
		return fmt.Errorf("start %s: %w", controllerBin, err)
	}
	exited := make(chan struct{})
	var exitErr error
	go func() {
		exitErr = ctrl.Wait()
		close(exited)
	}()

	if err := waitReady(ctx, "http://"+probeAddr+"/readyz", exited); err != nil {
		_ = ctrl.Process.Signal(syscall.SIGTERM)
		<-exited
		return errors.Join(err, exitErr)
	}
	fmt.Printf(`
student-controller is running. From another terminal:

    kubectl --kubeconfig %s get stu

The registry is the SQLite file %s
Metrics: http://%s/metrics   Readiness: http://%s/readyz
Press Ctrl-C to stop.

`, kubeconfig, registryFile, metricsAddr, probeAddr)

	select {
	case <-exited:
		return fmt.Errorf("student-controller exited: %v", exitErr)
	case <-ctx.Done():
	}
	say("Stopping student-controller")
	_ = ctrl.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		if exitErr != nil {
			return fmt.Errorf("student-controller: %w", exitErr)
		}
	case <-time.After(time.Minute):
		_ = ctrl.Process.Kill()
		<-exited
		return errors.New("student-controller did not stop within a minute; killed it")
	}
	return nil
}

// waitReady polls the controller's /readyz until it answers 200.
func waitReady(ctx context.Context, url string, exited <-chan struct{}) error {
	deadline := time.After(2 * time.Minute)
	for {
		resp, err := http.Get(url) // #nosec G107 -- our own controller's probe on loopback
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("student-controller exited before it was ready")
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("student-controller not ready after 2 minutes (%s)", url)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
