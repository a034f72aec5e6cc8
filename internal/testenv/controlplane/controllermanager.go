package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/student-controller/student-controller/internal/testenv/proc"
)

// Controllers are the kube-controller-manager controllers the local control plane
// runs: what a cluster uses to empty a namespace being deleted and to collect objects
// whose owner is gone. The others (Pods, nodes, volumes, ...) have nothing to do here.
var Controllers = []string{"namespace-controller", "garbage-collector-controller"}

// NodeControllers are the ones a node's Pods need as well: Deployments and their
// ReplicaSets, each namespace's default ServiceAccount and kube-root-ca.crt (which
// every Pod's token volume mounts), the node's readiness and taints, the Services'
// EndpointSlices (and the Endpoints that Prometheus reads), volume claims bound to
// volumes, PodDisruptionBudgets for drains, and Pods of a gone node collected.
var NodeControllers = []string{
	"deployment-controller", "replicaset-controller",
	"serviceaccount-controller", "root-ca-certificate-publisher-controller",
	"node-lifecycle-controller", "taint-eviction-controller",
	"endpointslice-controller", "endpoints-controller",
	"persistentvolume-binder-controller", "persistentvolumeclaim-protection-controller", "persistentvolume-protection-controller",
	"disruption-controller", "pod-garbage-collector-controller",
}

// startedLogs are what kube-controller-manager v1.37 logs once each controller works:
// the garbage collector's line comes after its first look at every resource.
var startedLogs = []string{`"Starting namespace controller"`, `"Proceeding to collect garbage"`}

// startControllerManager runs kube-controller-manager against the API server that
// kubeconfig reaches, logging to logDir, and waits until its controllers have started.
func startControllerManager(bin, kubeconfig, logDir string, forNode bool) (*proc.Process, error) {
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return nil, err
	}
	controllers := Controllers
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0", // nothing scrapes or probes it here
	}
	if forNode {
		controllers = slices.Concat(Controllers, NodeControllers)
		args = append(args,
			// What kube-root-ca.crt holds: the API server's self-made certificate.
			"--root-ca-file="+filepath.Join(logDir, "apiserver", "apiserver.crt"),
			// A node that stops reporting is marked so within 40 s (the default).
			"--node-monitor-grace-period=40s")
	}
	p, err := proc.Start(proc.Spec{
		Name: "kube-controller-manager",
		Path: bin,
		Args: append(args, "--controllers="+strings.Join(controllers, ",")),
		Log:  filepath.Join(logDir, "kube-controller-manager.log"),
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
			strings.Join(controllers, ", "), p.LogPath(), p.Tail(20)), p.Stop(10*time.Second))
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}
