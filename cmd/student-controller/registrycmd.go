package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/student-controller/student-controller/internal/registry"
)

const registryUsage = `Usage: student-controller registry move-cluster --registry URL --registry-owner OWNER --from CLUSTER [--kubeconfig FILE]

move-cluster binds an owner's rows to the cluster that --kubeconfig reaches, where the
registry binds them to CLUSTER now (the UID that the refusing controller printed). A
controller refuses to write for an owner bound to another cluster; this is the one
way to hand the rows over, for a rebuilt cluster or a registry moved with its data.
It prints the binding before and after, and changes nothing else.
`

// registryCommand runs "student-controller registry ...": explicit, one-off changes to
// what the registry records about its owners. It returns the process's exit code.
func registryCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "move-cluster" {
		fmt.Fprint(stderr, registryUsage)
		return 2
	}
	fs := flag.NewFlagSet("registry move-cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var opts options
	opts.addFlags(fs)
	from := fs.String("from", "", "The cluster the owner is bound to now (a kube-system namespace UID).")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *from == "" || opts.owner == "" || fs.NArg() > 0 {
		fmt.Fprint(stderr, registryUsage)
		return 2
	}
	if err := moveCluster(ctx, opts, *from, stdout); err != nil {
		fmt.Fprintf(stderr, "student-controller registry move-cluster: %v\n", err)
		return 1
	}
	return 0
}

func moveCluster(ctx context.Context, opts options, from string, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cfg, err := clientcmd.BuildConfigFromFlags(opts.master, opts.kubeconfig)
	if err != nil {
		return fmt.Errorf("build client config: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	to, err := clusterID(ctx, client)
	if err != nil {
		return err
	}
	reg, err := registry.Open(ctx, opts.registryURL, registry.Options{Password: opts.registryPassword()})
	if err != nil {
		return err
	}
	defer reg.Close()
	fmt.Fprintf(stdout, "registry %s, owner %q: bound to cluster %s; moving it to cluster %s (%s)\n", reg, opts.owner, from, to, cfg.Host)
	b, err := reg.MoveCluster(ctx, opts.owner, from, to)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "owner %q is bound to cluster %s since %s\n", b.Owner, b.Cluster, b.BoundAt.Format(time.RFC3339))
	return nil
}
