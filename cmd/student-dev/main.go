// Command student-dev runs the whole system on one machine with no cluster: a real
// etcd, kube-apiserver and kube-controller-manager from bin/k8s, the Student CRD, the
// sample Students, and student-controller on a SQLite file, until Ctrl-C. `make run`
// builds and starts it. The one-node cluster of `make cluster` is student-node's.
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
	"github.com/student-controller/student-controller/internal/testenv/proc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	// After the first signal, a second one ends this process at once (its children get
	// SIGKILL or SIGTERM).
	go func() {
		<-ctx.Done()
		stop()
	}()
	stateDir := flag.String("state-dir", ".local", "Folder for the local state: etcd data, kubeconfig, registry file.")
	controllerBin := flag.String("controller", "bin/student-controller", "The student-controller binary to run.")
	probeAddr := flag.String("health-probe-bind-address", "127.0.0.1:8081", "Passed to the controller; also polled for readiness.")
	metricsAddr := flag.String("metrics-bind-address", "127.0.0.1:8080", "Passed to the controller.")
	tracing := flag.String("tracing-endpoint", "",
		"An OpenTelemetry collector (OTLP/gRPC, HOST:PORT): the controller traces its syncs there, and kube-apiserver continues each trace to etcd.")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: student-dev [flags] [-- controller flags]\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(ctx, *stateDir, *controllerBin, *probeAddr, *metricsAddr, *tracing, flag.Args()); err != nil {
		fmt.Fprintf(os.Stderr, "student-dev: %v\n", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

func run(ctx context.Context, stateDir, controllerBin, probeAddr, metricsAddr, tracing string, extra []string) (err error) {
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

	controllerManager, err := buildControllerManager(ctx, root, state)
	if err != nil {
		return err
	}
	// On every way out: the build ends (and kube-controller-manager does not start
	// after), then the control plane stops.
	var env *controlplane.Env
	defer func() {
		controllerManager.stop()
		if env == nil {
			return
		}
		say("Stopping the control plane")
		err = errors.Join(err, env.Stop())
		if err == nil {
			say("Stopped; the state stays in %s for the next run", state)
		}
	}()
	say("Starting the local control plane from bin/k8s: etcd, kube-apiserver, and kube-controller-manager running %s (data in %s)",
		strings.Join(controlplane.Controllers, " and "), state)
	opts := controlplane.Options{Root: root, Dir: state, WithoutControllerManager: true}
	if tracing != "" {
		// Rate 0: kube-apiserver traces only the requests whose caller sampled them,
		// the controller's syncs.
		config := filepath.Join(state, "apiserver-tracing.yaml")
		if err := os.WriteFile(config, fmt.Appendf(nil, "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: %s\nsamplingRatePerMillion: 0\n", tracing), 0o600); err != nil {
			return err
		}
		opts.APIServerFlags = map[string]string{"tracing-config-file": config}
		extra = append([]string{"--tracing-endpoint", tracing}, extra...)
		say("Tracing to %s: the controller's syncs, and kube-apiserver's requests within them", tracing)
	}
	if env, err = controlplane.Start(opts); err != nil {
		return err
	}
	started, err := controllerManager.start(env)
	if err != nil {
		return err
	}
	const installed = "the Student CRD and the admission policy that adds its finalizer are installed"
	if started {
		say("Control plane up (kube-controller-manager logs to %s); %s", env.ControllerManagerLog(), installed)
	} else {
		say("Control plane up; %s. kube-controller-manager is still compiling (%s) and starts once built: the rest does not wait for it", installed, controllerManager.log)
	}

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
	// Its own process group, so that Ctrl-C reaches it only through us, after which we
	// wait for it to drain; and it dies with us if we are killed. Its output is ours.
	ctrl, err := proc.Start(proc.Spec{Name: "student-controller", Path: controllerBin, Args: args, Tee: os.Stdout, DeathSignal: syscall.SIGTERM})
	if err != nil {
		return err
	}
	ready, err := ctrl.WaitUntil(ctx, 2*time.Minute, func() bool {
		resp, err := http.Get("http://" + probeAddr + "/readyz") // #nosec G107 -- our own controller's probe on loopback
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if err == nil && !ready {
		err = fmt.Errorf("student-controller not ready after 2 minutes (http://%s/readyz)", probeAddr)
	}
	if err != nil {
		return errors.Join(err, ctrl.Stop(time.Minute))
	}
	fmt.Printf(`
student-controller is running. From another terminal:

    kubectl --kubeconfig %s get stu

The registry is the SQLite file %s
Metrics: http://%s/metrics   Readiness: http://%s/readyz
Press Ctrl-C to stop.

`, kubeconfig, registryFile, metricsAddr, probeAddr)

	select {
	case <-ctrl.Exited():
		return fmt.Errorf("student-controller exited: %v", ctrl.ExitErr())
	case <-ctx.Done():
	}
	say("Stopping student-controller")
	if err := ctrl.Stop(time.Minute); err != nil {
		return err
	}
	if err := ctrl.ExitErr(); err != nil {
		return fmt.Errorf("student-controller: %w", err)
	}
	return nil
}
