package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/mark"
	"github.com/student-controller/student-controller/internal/registry"
)

const registryUsage = `Usage:
  student-controller registry move-cluster --registry URL --registry-owner OWNER --from CLUSTER [--kubeconfig FILE] [--migrate]
  student-controller registry rename-owner --registry URL --registry-owner OWNER --to NEW [--migrate]
  student-controller registry backup --registry URL --to FILE
  student-controller registry adopt --registry URL --registry-owner OWNER [--kubeconfig FILE] [--dry-run]
      [--namespace NS,...] [--school SCHOOL] [--create-namespaces] [--max-adoptions N] [-o table|json] [--migrate]
  student-controller registry prune --registry URL --registry-owner OWNER --registry-mark-namespace NS
      [--leader-elect-id LEASE] [--kubeconfig FILE] [--namespace NS,...] [--max-prunes N] [--yes] [--migrate]
  student-controller registry confirm-restore --registry URL --registry-owner OWNER --registry-mark-namespace NS
      [--leader-elect-id LEASE] [--kubeconfig FILE]

  move-cluster  binds OWNER's rows to the cluster --kubeconfig reaches, where the registry binds them to
                CLUSTER now (the UID a refusing controller printed): a rebuilt cluster, a moved registry.
  rename-owner  gives every row of OWNER, and its cluster binding, to NEW, which must own nothing yet.
  backup        copies a SQLite registry to FILE, which must not exist, while controllers write.
  adopt         makes an observed Student of each row that has none in this cluster (released rows,
                rows of gone Students, rows another system inserted); --dry-run lists them.
  prune         deletes the rows OWNER released without their Students while they recorded Delete;
                only with --yes, and never while the registry is behind the cluster's mark.
  confirm-restore  accepts a registry put back from a backup as it is, when it is behind the cluster's
                mark: the controller lets go of rows again, and prune and adopt run.

Every subcommand that writes takes the owner's write fence first, and refuses while a
controller of the owner holds it: scale the controller to zero first. A registry whose
schema is older than this program's is refused unless --migrate. adopt and prune exit
2 when rows were left alone or would change, 1 on an error, 0 otherwise. The task
pages: docs/adopt.md, docs/backup-and-restore.md, docs/operating.md.
`

// registryFlags are the registry subcommands' own flags, beside the controller's.
type registryFlags struct {
	from, to string
	migrate  bool
	prune    pruneOptions
	adopt    adoptOptions
}

// add defines rf's flags on fs (docs/flags.md lists them from here too).
func (rf *registryFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&rf.from, "from", "", "move-cluster: the cluster the owner is bound to now (a kube-system namespace UID).")
	fs.StringVar(&rf.to, "to", "", "rename-owner: the owner's new name; backup: the file to write.")
	fs.BoolVar(&rf.migrate, "migrate", false, "move-cluster, rename-owner, adopt, prune: migrate a registry whose schema is older than this program's first.")
	fs.IntVar(&rf.prune.max, "max-prunes", 100, "prune: the most rows one run deletes; past it, it deletes none.")
	fs.BoolVar(&rf.prune.yes, "yes", false, "prune: delete the rows listed; without it prune only lists them.")
	fs.StringVar(&rf.adopt.school, "school", "", "adopt: only rows of this school.")
	fs.BoolVar(&rf.adopt.createNamespaces, "create-namespaces", false, "adopt: make the namespaces that rows name and that do not exist.")
	fs.IntVar(&rf.adopt.max, "max-adoptions", 1000, "adopt: the most rows one run adopts; past it, it adopts none.")
	fs.StringVar(&rf.adopt.output, "o", "table", "adopt: output format, table or json.")
}

// registryCommand runs "student-controller registry ..." and returns the exit code.
func registryCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || !slices.Contains([]string{"move-cluster", "rename-owner", "backup", "adopt", "prune", "confirm-restore"}, args[0]) {
		fmt.Fprint(stderr, registryUsage)
		return 2
	}
	fs := flag.NewFlagSet("registry "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	var opts options
	opts.addFlags(fs)
	var rf registryFlags
	rf.add(fs)
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	code, err := -1, opts.parseRegistry() // -1 until a subcommand runs: print the usage
	switch {
	case err != nil, fs.NArg() > 0 || (args[0] != "backup" && opts.owner == ""):
	case args[0] == "backup" && rf.to != "" && !rf.migrate:
		code, err = 0, backup(ctx, opts, rf.to, stdout)
	case args[0] == "move-cluster" && rf.from != "":
		code, err = 0, moveCluster(ctx, opts, rf.from, rf.migrate, stdout)
	case args[0] == "rename-owner" && rf.to != "":
		code, err = 0, renameOwner(ctx, opts, rf.to, rf.migrate, stdout)
	case args[0] == "confirm-restore" && !rf.migrate:
		code, err = 0, confirmRestore(ctx, opts, stdout)
	case args[0] == "adopt" && (rf.adopt.output == "table" || rf.adopt.output == "json"), args[0] == "prune":
		if opts.scope, err = controller.ParseScope(opts.namespace, ""); err != nil {
			break
		}
		ctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		if args[0] == "adopt" {
			code, err = adoptRows(ctx, opts, rf.adopt, rf.migrate, stdout, stderr)
		} else {
			code, err = pruneRows(ctx, opts, rf.prune, rf.migrate, stdout)
		}
	}
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "student-controller registry %s: %v\n", args[0], err)
		return 1
	case code < 0:
		fmt.Fprint(stderr, registryUsage)
		return 2
	}
	return code
}

func renameOwner(ctx context.Context, opts options, to string, migrate bool, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	reg, release, err := openFenced(ctx, opts, migrate)
	if err != nil {
		return err
	}
	defer func() { release(); _ = reg.Close() }()
	n, err := reg.RenameOwner(ctx, opts.owner, to)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "registry %s: %d rows and the cluster binding of owner %q now belong to %q\n", reg, n, opts.owner, to)
	return nil
}

func moveCluster(ctx context.Context, opts options, from string, migrate bool, stdout io.Writer) error {
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
	reg, release, err := openFenced(ctx, opts, migrate)
	if err != nil {
		return err
	}
	defer func() { release(); _ = reg.Close() }()
	fmt.Fprintf(stdout, "registry %s, owner %q: bound to cluster %s; moving it to cluster %s (%s)\n", reg, opts.owner, from, to, cfg.Host)
	b, err := reg.MoveCluster(ctx, opts.owner, from, to)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "owner %q is bound to cluster %s since %s\n", b.Owner, b.Cluster, b.BoundAt.Format(time.RFC3339))
	return nil
}

// confirmRestore accepts the registry as it is where it is behind the cluster's mark,
// in place of annotating the mark's ConfigMap by hand.
func confirmRestore(ctx context.Context, opts options, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := commandClients(ctx, opts)
	if err != nil {
		return err
	}
	reg, err := registry.OpenURL(ctx, opts.registry, registry.Options{Password: opts.registryPassword(), ReadOnly: true})
	if err != nil {
		return err
	}
	defer reg.Close()
	if err := reg.CheckBinding(ctx, opts.owner, c.id); err != nil {
		return err
	}
	said, err := mark.Confirm(ctx, c.kube, markPlace(opts), opts.owner, reg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "registry %s, owner %q: %s\n", reg, opts.owner, said)
	return nil
}

// openFenced opens the registry to write for opts.owner, taking the owner's write fence
// before any write, a migration (only with migrate) included. It refuses, naming the
// holder, while a controller holds it. Call release before Close.
func openFenced(ctx context.Context, opts options, migrate bool) (*registry.Registry, func(), error) {
	reg, err := registry.OpenURL(ctx, opts.registry, registry.Options{Password: opts.registryPassword(), MigrateLater: true, KeepSchema: !migrate})
	if err != nil {
		return nil, nil, err
	}
	release, changed := func() {}, "Nothing was changed"
	fence := func() error {
		var err error
		if release, err = reg.Fence(ctx, opts.owner); err != nil {
			release = func() {}
		}
		if errors.Is(err, registry.ErrHeld) {
			return fmt.Errorf("%w. %s. Stop the controllers of owner %q first (scale them to zero), then run it again", err, changed, opts.owner)
		}
		return err
	}
	// A schema older than the fence's lease has no holder to refuse: migrate first.
	lease, err := reg.FenceIsLease(ctx)
	if err == nil && lease {
		err = fence()
	}
	if err == nil {
		if migrate {
			err = reg.Migrate(ctx)
		} else {
			err = reg.UseSchema(ctx)
		}
		if errors.Is(err, registry.ErrSchemaOlder) || errors.Is(err, registry.ErrNoSchema) {
			err = fmt.Errorf("%w. Nothing was changed. Run it again with --migrate to migrate the schema first; "+
				"controllers of the older version refuse the registry afterwards, so stop them first", err)
		}
	}
	if err == nil && !lease {
		if migrate {
			changed = "The schema was migrated; nothing else was changed"
		}
		err = fence()
	}
	if err != nil {
		release()
		return nil, nil, errors.Join(err, reg.Close())
	}
	return reg, release, nil
}

// openRegistry opens the registry as openFenced to write, else read-only (no-op release).
func openRegistry(ctx context.Context, opts options, write, migrate bool) (*registry.Registry, func(), error) {
	if write {
		return openFenced(ctx, opts, migrate)
	}
	reg, err := registry.OpenURL(ctx, opts.registry, registry.Options{Password: opts.registryPassword(), ReadOnly: true})
	return reg, func() {}, err
}

// backup copies a SQLite registry to the new file to, and says what the copy holds.
func backup(ctx context.Context, opts options, to string, stdout io.Writer) error {
	c, err := registry.Backup(ctx, opts.registry, to)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "registry %s: backed up to %s (%d rows, %d history rows)\n", opts.registry, c.Path, c.Rows, c.History)
	return nil
}
