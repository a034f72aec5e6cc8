package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/student-controller/student-controller/internal/testenv/proc"
)

// Controllers are the kube-controller-manager controllers the local control plane
// runs: what a cluster uses to empty a namespace being deleted and to collect objects
// whose owner is gone. The others (Pods, nodes, volumes, ...) have nothing to do here.
var Controllers = []string{"namespace-controller", "garbage-collector-controller"}

// startedLogs are what kube-controller-manager v1.37 logs once each controller works:
// the garbage collector's line comes after its first look at every resource.
var startedLogs = []string{`"Starting namespace controller"`, `"Proceeding to collect garbage"`}

// startControllerManager runs kube-controller-manager against the API server that
// kubeconfig reaches, logging to logDir, and waits until its controllers have started.
func startControllerManager(bin, kubeconfig, logDir string) (*proc.Process, error) {
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return nil, err
	}
	p, err := proc.Start(proc.Spec{
		Name: "kube-controller-manager",
		Path: bin,
		Args: []string{
			"--kubeconfig=" + kubeconfig,
			"--controllers=" + strings.Join(Controllers, ","),
			"--leader-elect=false",
			"--secure-port=0", // nothing scrapes or probes it here
		},
		Log: filepath.Join(logDir, "kube-controller-manager.log"),
	})
	if err != nil {
		return nil, err
	}
	started, err := p.WaitUntil(context.Background(), time.Minute, func() bool {
		out := p.Output()
		for _, line := range startedLogs {
			if !strings.Contains(out, line) {
				return false
			}
		}
		return true
	})
	if err == nil && !started {
		err = errors.Join(fmt.Errorf("kube-controller-manager did not start %s within a minute; its log %s ends:\n%s",
			strings.Join(Controllers, ", "), p.LogPath(), p.Tail(20)), p.Stop(10*time.Second))
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}
