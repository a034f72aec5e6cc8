package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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

// clusterMain is `student-node cluster`: a one-node cluster (the control plane and a
// node) with the chart installed from the image `make image` built, until Ctrl-C.
func clusterMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cluster", flag.ExitOnError)
	stateDir := fs.String("state-dir", ".local/cluster", "Folder for the cluster's state; emptied at start, kept after Ctrl-C for its logs.")
	layout := fs.String("image", "bin/image/oci", "The OCI layout of the controller's image (make image writes it).")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: student-node cluster [flags] [-- helm install flags]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	return cluster(ctx, *stateDir, *layout, fs.Args())
}

func cluster(ctx context.Context, stateDir, layout string, helmArgs []string) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("make cluster runs a kubelet, which needs root: run it as root")
	}
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
	// Each run starts a new cluster in the state folder, which must be one of ours.
	if err := claimStateDir(state); err != nil {
		return err
	}

	say("Reserving this machine for the node %s (its address %s, on the bridge %s)", node.Name, node.IP, node.Bridge)
	n, err := node.New(ctx, root, node.Options{Dir: filepath.Join(state, "node"), Log: func(f string, a ...any) { say(f, a...) }})
	var cp *controlplane.Env
	defer func() {
		if n != nil {
			say("Stopping the node: removing its Pods' containers, mounts, network and cgroups")
			err = errors.Join(err, n.Stop())
			if left := node.Leftovers(n.Dir); len(left) > 0 {
				err = errors.Join(err, fmt.Errorf("the node left behind: %v", left))
			}
		}
		if cp != nil {
			say("Stopping the control plane")
			err = errors.Join(err, cp.Stop())
		}
		if err == nil {
			say("Stopped; the logs stay in %s until the next make cluster", state)
		}
	}()
	if err != nil {
		return err
	}
	say("Starting the control plane from bin/k8s, listening on the node's address %s (state in %s)", node.IP, state)
	if err := os.RemoveAll(filepath.Join(state, "controlplane")); err != nil {
		return err
	}
	cp, err = controlplane.Start(controlplane.Options{Root: root, Dir: filepath.Join(state, "controlplane"),
		NodeAddress: node.IP.String(), WithoutAdmissionPolicy: true, WithoutCRD: true}) // the chart installs both
	if err != nil {
		return err
	}
	say("Starting the node %s: containerd, kubelet, kube-proxy and kube-scheduler", node.Name)
	if err := n.Start(ctx, cp); err != nil {
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

	where := "the SQLite file on the Pod's volume, in " + filepath.Join(n.Dir, "volumes")
	if slices.ContainsFunc(helmArgs, func(a string) bool { return strings.Contains(a, "registry.url=") }) {
		where = "the one your registry.url names"
	}
	fmt.Printf(`
A one-node cluster runs student-controller as a Pod. From another terminal:

    export KUBECONFIG=%s
    kubectl get nodes,pods -A
    kubectl get stu
    kubectl -n %s logs deploy/student-controller

The registry is %s.
Logs of the node's parts (kubelet, containerd, ...) are in %s.
Press Ctrl-C to stop; everything the node made is removed.

`, cp.Kubeconfig, systemNamespace, where, n.Dir)
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

// claimStateDir makes state the cluster's state folder: missing, empty, or one an
// earlier make cluster marked; never any other folder, which it would empty.
func claimStateDir(state string) error {
	const mark = ".student-cluster"
	entries, err := os.ReadDir(state)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if len(entries) > 0 {
		if _, err := os.Stat(filepath.Join(state, mark)); err != nil {
			return fmt.Errorf("%s holds files and is not a cluster's state folder (no %s): choose another --state-dir", state, mark)
		}
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(state, mark), nil, 0o600)
}

// cleanNodeMain is `student-node clean-node`: removes what a node that was killed
// left, from the record it kept.
func cleanNodeMain(args []string) error {
	fs := flag.NewFlagSet("clean-node", flag.ExitOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("a node's leftovers belong to root: run it as root")
	}
	removed, err := node.Recover()
	for _, r := range removed {
		say("removed %s", r)
	}
	if err != nil {
		return err
	}
	if left := node.Leftovers(""); len(left) > 0 {
		return fmt.Errorf("no node of ours recorded these, so they stay (another Kubernetes node's?):\n  %s", strings.Join(left, "\n  "))
	}
	say("nothing of a node is left")
	return nil
}

func command(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...) // #nosec G204 -- helm and kubectl, on the local cluster
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}
