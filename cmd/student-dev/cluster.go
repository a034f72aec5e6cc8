package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/node"
)

const systemNamespace = controlplane.ControllerNamespace

// clusterMain is `student-dev cluster`: a one-node cluster (the control plane and a
// node) with the chart installed from the image `make image` built, until Ctrl-C.
func clusterMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cluster", flag.ExitOnError)
	stateDir := fs.String("state-dir", ".local/cluster", "Folder for the cluster's state; emptied at start, kept after Ctrl-C for its logs.")
	layout := fs.String("image", "bin/image/oci", "The OCI layout of the controller's image (make image writes it).")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: student-dev cluster [flags] [-- helm install flags]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	return cluster(ctx, *stateDir, *layout, fs.Args())
}

func cluster(ctx context.Context, stateDir, layout string, helmArgs []string) (err error) {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	state, err := filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(layout, "index.json")); err != nil {
		return fmt.Errorf("no controller image in %s (make image writes it): %w", layout, err)
	}
	// Each run starts a new cluster: what an earlier one left is removed first.
	if err := node.Clean(filepath.Join(state, "node")); err != nil {
		return fmt.Errorf("remove what the last cluster left: %w", err)
	}
	if err := os.RemoveAll(state); err != nil {
		return err
	}

	say("Starting the control plane from bin/k8s, listening on this machine's address so that Pods reach it (state in %s)", state)
	cp, err := controlplane.Start(controlplane.Options{Root: root, Dir: filepath.Join(state, "controlplane"), ForNode: true, WithoutAdmissionPolicy: true})
	if err != nil {
		return err
	}
	defer func() {
		say("Stopping the control plane")
		if err = errors.Join(err, cp.Stop()); err == nil {
			say("Stopped; the logs stay in %s until the next make cluster", state)
		}
	}()
	say("Starting the node %s: containerd, kubelet, kube-proxy and kube-scheduler", node.Name)
	n, err := node.Start(ctx, cp, node.Options{Dir: filepath.Join(state, "node"), Log: func(f string, a ...any) { say(f, a...) }})
	if n != nil {
		defer func() {
			say("Stopping the node: removing its Pods' containers, mounts, network and cgroups")
			err = errors.Join(err, n.Stop())
			if left := node.Leftovers(n.Dir); len(left) > 0 {
				err = errors.Join(err, fmt.Errorf("the node left behind: %v (student-dev clean-node removes it)", left))
			}
		}()
	}
	if err != nil {
		return err
	}

	ref := n.Registry + "/student-controller"
	digest, err := n.PushLayout(ctx, layout, ref+":dev")
	if err != nil {
		return err
	}
	say("Pushed the image of %s to the node's registry: %s@%s", layout, ref, digest)

	kube := kubernetes.NewForConfigOrDie(cp.Config)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: systemNamespace,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	say("Installing the chart (helm install student-controller charts/student-controller) in %s, Pod Security restricted", systemNamespace)
	helm := append([]string{"install", "student-controller", filepath.Join(root, "charts", "student-controller"),
		"--namespace", systemNamespace, "--kubeconfig", cp.Kubeconfig,
		"--set", "image.repository=" + ref, "--set", "image.digest=" + digest}, helmArgs...)
	if err := command(ctx, filepath.Join(root, "bin", "tools", "helm"), helm...); err != nil {
		return fmt.Errorf("helm install: %w", err)
	}
	say("Waiting for the controller's Pod to be Ready")
	if err := waitPodsReady(ctx, kube); err != nil {
		return err
	}
	say("Applying the sample Students (config/samples)")
	if err := command(ctx, "kubectl", "--kubeconfig", cp.Kubeconfig, "apply", "-k", filepath.Join(root, "config", "samples")); err != nil {
		return err
	}

	fmt.Printf(`
A one-node cluster runs student-controller as a Pod. From another terminal:

    export KUBECONFIG=%s
    kubectl get nodes,pods -A
    kubectl get stu
    kubectl -n %s logs deploy/student-controller

The registry is the SQLite file on the Pod's volume, in %s.
Logs of the node's parts (kubelet, containerd, ...) are in %s.
Press Ctrl-C to stop; everything the node made is removed.

`, cp.Kubeconfig, systemNamespace, filepath.Join(n.Dir, "volumes"), n.Dir)
	<-ctx.Done()
	return nil
}

// waitPodsReady waits until the controller's Pods are all Ready.
func waitPodsReady(ctx context.Context, kube kubernetes.Interface) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := kube.CoreV1().Pods(systemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=student-controller"})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return true, nil
				}
			}
			last = fmt.Sprintf("Pod %s is %s", p.Name, p.Status.Phase)
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Waiting != nil {
					last += ": " + cs.State.Waiting.Reason + " " + cs.State.Waiting.Message
				}
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("the controller's Pod not Ready within 3 minutes (%s): kubectl -n %s describe pods says why", last, systemNamespace)
	}
	return nil
}

// cleanNodeMain is `student-dev clean-node`: removes what a node that was killed left.
func cleanNodeMain(args []string) error {
	fs := flag.NewFlagSet("clean-node", flag.ExitOnError)
	stateDir := fs.String("state-dir", ".local/cluster", "The cluster's state folder (its node folder's mounts are removed too).")
	if err := fs.Parse(args); err != nil {
		return err
	}
	state, err := filepath.Abs(*stateDir)
	if err != nil {
		return err
	}
	dir := filepath.Join(state, "node")
	before := node.Leftovers(dir)
	if err := node.Clean(dir); err != nil {
		return err
	}
	for _, l := range before {
		say("removed %s", l)
	}
	if left := node.Leftovers(dir); len(left) > 0 {
		return fmt.Errorf("still there: %v", left)
	}
	say("nothing of a node is left")
	return nil
}

func command(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...) // #nosec G204 -- helm and kubectl, on the local cluster
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}
