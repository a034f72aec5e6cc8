package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/student-controller/student-controller/internal/controller"
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

move-cluster binds an owner's rows to the cluster that --kubeconfig reaches, where the
registry binds them to CLUSTER now (the UID that the refusing controller printed). A
controller refuses to write for an owner bound to another cluster; this is the one
way to hand the rows over, for a rebuilt cluster or a registry moved with its data.

rename-owner gives every row of OWNER, and its cluster binding, to NEW, which must own
nothing yet; then start the controller with --registry-owner NEW. Stop the
controllers of OWNER first: the rows they own are no longer theirs afterwards.

Both print what they change, and change nothing else. A registry whose schema is older
than this program's is refused unless --migrate says to migrate it first: controllers
of the older version then refuse the registry, so stop them first.

Every subcommand that writes (move-cluster, rename-owner, adopt, prune --yes) takes
the owner's write fence first and holds it while it writes: while a controller of
the owner runs, it refuses and names it. Scale the controller to zero first.

adopt makes a Student of each row that has none in this cluster: released rows, rows
of OWNER whose Students are gone (a rebuilt cluster, after move-cluster), and rows
another system inserted (uid, namespace, name, student_name and school are enough).
Each Student takes its namespace, name and spec from the row, its deletion policy too
(Orphan when the row records none), and is observed (spec.management: Observe): the
controller compares the row and never writes it until the Student is switched to
Manage. The row is bound to the new Student and OWNER, with a history row "adopted".
Rows of another owner, rows whose namespace and name a Student of another uid holds,
and rows that cannot be Students are left alone and listed; so are rows in namespaces
that do not exist, unless --create-namespaces. Past --max-adoptions rows to adopt, it
adopts none. --dry-run lists what it would do and changes nothing. Exit status: 2 when
rows were left alone (refused or unreadable) or, with --dry-run, would be adopted; 1 on
an error; 0 otherwise. A second run adopts nothing new, and finishes what a run cut
short left. Run it before the controller starts on a
rebuilt cluster: until then its sweep takes OWNER's rows without Students for orphans.

prune deletes rows that OWNER released because their Students were not found (the
sweep never deletes on absence) while they recorded the Delete policy: the rows a
finalizer would have deleted. It asks the API server for each and keeps those whose
Student is there. Without --yes it lists them and changes nothing; past --max-prunes
rows (100) it deletes none. It reads the registry's mark that the cluster keeps (the
ConfigMap LEASE-registry-mark in --registry-mark-namespace) and refuses when it cannot
find it, or the registry is behind it (put back in time, not yet confirmed). Exit status: 2
when rows would be pruned, or were refused; 1 on an error; 0 otherwise. Back up the
registry first.

backup copies a SQLite registry to FILE, which must not exist, while controllers go on
writing: rows and history of one moment. It changes nothing. A PostgreSQL registry is
backed up with pg_dump (docs/backup-and-restore.md).
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

// registryCommand runs "student-controller registry ...": explicit, one-off changes to
// what the registry records about its owners. It returns the process's exit code.
func registryCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "move-cluster" && args[0] != "rename-owner" && args[0] != "backup" && args[0] != "adopt" && args[0] != "prune") {
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
	from, to, migrate, po, ao := &rf.from, &rf.to, &rf.migrate, rf.prune, rf.adopt
	if err := opts.parseRegistry(); err != nil {
		fmt.Fprintf(stderr, "student-controller registry %s: %v\n", args[0], err)
		return 1
	}
	var err error
	switch {
	case fs.NArg() > 0:
		fmt.Fprint(stderr, registryUsage)
		return 2
	case args[0] == "backup" && *to != "" && !*migrate:
		err = backup(ctx, opts, *to, stdout)
	case opts.owner == "":
		fmt.Fprint(stderr, registryUsage)
		return 2
	case args[0] == "move-cluster" && *from != "":
		err = moveCluster(ctx, opts, *from, *migrate, stdout)
	case args[0] == "rename-owner" && *to != "":
		err = renameOwner(ctx, opts, *to, *migrate, stdout)
	case args[0] == "adopt" && (ao.output == "table" || ao.output == "json"):
		if opts.scope, err = controller.ParseScope(opts.namespace, ""); err != nil {
			break
		}
		ao.migrate = *migrate
		var code int
		ctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		if code, err = adoptRows(ctx, opts, ao, stdout, stderr); err == nil {
			return code
		}
	case args[0] == "prune":
		if opts.scope, err = controller.ParseScope(opts.namespace, ""); err != nil {
			break
		}
		po.migrate = *migrate
		var code int
		ctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		if code, err = pruneRows(ctx, opts, po, stdout); err == nil {
			return code
		}
	default:
		fmt.Fprint(stderr, registryUsage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "student-controller registry %s: %v\n", args[0], err)
		return 1
	}
	return 0
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

// openFenced opens the registry for a subcommand that writes for opts.owner, and
// takes and holds the owner's write fence before anything is written, the schema
// included: its schema as it is, unless migrate says to bring it up to this
// program's. While a controller of the owner holds the fence it refuses and names it.
// release gives the fence back; call it before closing the registry.
func openFenced(ctx context.Context, opts options, migrate bool) (*registry.Registry, func(), error) {
	reg, err := registry.OpenURL(ctx, opts.registry, registry.Options{Password: opts.registryPassword(), MigrateLater: true, KeepSchema: !migrate})
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (*registry.Registry, func(), error) {
		return nil, nil, errors.Join(err, reg.Close())
	}
	// A schema older than the fence's lease has no holder to refuse: it is migrated
	// (when asked) before the fence is taken, as a controller does.
	lease, err := reg.FenceIsLease(ctx)
	if err != nil {
		return fail(err)
	}
	release := func() {}
	changed := "Nothing was changed"
	fence := func() error {
		var err error
		release, err = reg.Fence(ctx, opts.owner)
		if errors.Is(err, registry.ErrHeld) {
			release = func() {}
			return fmt.Errorf("%w. %s. Stop the controllers of owner %q first (scale them to zero), then run it again", err, changed, opts.owner)
		}
		if err != nil {
			release = func() {}
		}
		return err
	}
	if lease {
		if err := fence(); err != nil {
			return fail(err)
		}
	}
	if migrate {
		err = reg.Migrate(ctx)
	} else {
		err = reg.UseSchema(ctx)
	}
	if errors.Is(err, registry.ErrSchemaOlder) || errors.Is(err, registry.ErrNoSchema) {
		err = fmt.Errorf("%w. Nothing was changed. Run it again with --migrate to migrate the schema first; "+
			"controllers of the older version refuse the registry afterwards, so stop them first", err)
	}
	if err == nil && !lease {
		if migrate {
			changed = "The schema was migrated; nothing else was changed"
		}
		err = fence()
	}
	if err != nil {
		release()
		return fail(err)
	}
	return reg, release, nil
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
