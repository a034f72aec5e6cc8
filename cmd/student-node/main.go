// Command student-node runs a one-node cluster on this machine: the control plane
// from bin/k8s, a kubelet over containerd, kube-proxy and kube-scheduler, with the
// chart installed from the image `make image` built, until Ctrl-C. `make cluster`
// builds and starts it; it runs as root. It is apart from student-dev (make run), so
// that make run never compiles the node's code.
//
//	student-node cluster      # the one-node cluster (make cluster)
//	student-node clean-node   # remove what a killed cluster's node left behind
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	// After the first signal, a second one ends this process at once (its children get
	// SIGKILL or SIGTERM, and the next make cluster removes what a node left).
	go func() {
		<-ctx.Done()
		stop()
	}()
	if len(os.Args) < 2 || (os.Args[1] != "cluster" && os.Args[1] != "clean-node") {
		fmt.Fprintf(os.Stderr, "Usage: student-node cluster [flags] [-- helm install flags]\n       student-node clean-node [flags]\n")
		os.Exit(2)
	}
	var err error
	if os.Args[1] == "cluster" {
		err = clusterMain(ctx, os.Args[2:])
	} else {
		err = cleanNodeMain(os.Args[2:])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "student-node %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func say(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }
