package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	tracingv1 "k8s.io/component-base/tracing/api/v1"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/registry"
)

// options are the command-line flags.
type options struct {
	kubeconfig              string
	master                  string
	namespace               string
	selector                string
	qps                     float64
	burst                   int
	workers                 int
	registryURL             string
	registry                registry.URL // registryURL, parsed by parseRegistry
	passwordFile            string
	maxOpenConns            int
	maxIdleConns            int
	connMaxLifetime         time.Duration
	owner                   string
	markNamespace           string
	sweepInterval           time.Duration
	sweepMaxDeletions       int
	maxRewinds              int
	fenceLease              time.Duration
	lockWait                time.Duration
	sweepMaxDeletionPercent int
	historyRetention        time.Duration
	sqliteShared            bool
	resyncPeriod            time.Duration
	syncTimeout             time.Duration
	shutdownTimeout         time.Duration
	rateLimiter             string
	dryRun                  bool
	tracingEndpoint         string
	tracingSamplingRate     int

	leaderElect          bool
	leaderElectNamespace string
	leaderElectID        string
	leaseDuration        time.Duration
	renewDeadline        time.Duration
	retryPeriod          time.Duration

	set   map[string]bool  // the flags given on the command line, by name
	scope controller.Scope // --namespace and --selector, parsed by validate

	metricsAddr   string
	metricsSecure bool
	probeAddr     string
	pprofAddr     string

	version bool
}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig. Only required if out-of-cluster.")
	fs.StringVar(&o.master, "master", "", "The address of the Kubernetes API server. Overrides any value in kubeconfig. Only required if out-of-cluster.")
	fs.StringVar(&o.namespace, "namespace", "",
		"Only watch Students in these namespaces, separated by commas (one watch each). All namespaces when empty. "+
			"The sweep leaves the rows of other namespaces alone.")
	fs.StringVar(&o.selector, "selector", "",
		"Only watch Students whose labels match this selector (as kubectl's -l takes it, e.g. team=a or 'tier in (gold,silver)'); "+
			"the API server filters them. A Student whose labels stop matching keeps its row and its finalizer: "+
			"this controller no longer sees it, and deleting it waits until a controller whose scope has it removes the finalizer.")
	fs.Float64Var(&o.qps, "kube-api-qps", 500, "Queries per second to the API server, sustained. The server protects itself with API Priority and Fairness; this bounds one controller.")
	fs.IntVar(&o.burst, "kube-api-burst", 1000, "Queries to the API server in a burst.")
	fs.IntVar(&o.workers, "workers", 8, "Students synced in parallel.")
	fs.StringVar(&o.registryURL, "registry", "sqlite:student-registry.db",
		"The student registry: sqlite:///ABSOLUTE/PATH.db, sqlite:RELATIVE/PATH.db (relative to the working directory), "+
			"or postgres://USER@HOST:PORT/DATABASE?sslmode=verify-full. Give a PostgreSQL password with --registry-password-file "+
			"or the REGISTRY_PASSWORD environment variable: a URL with a password is refused, since it shows in the process list.")
	fs.StringVar(&o.passwordFile, "registry-password-file", "",
		"File holding the registry's password (a mounted Secret); overrides REGISTRY_PASSWORD.")
	fs.IntVar(&o.maxOpenConns, "registry-max-open-conns", 0, "Most connections open to the registry at once; 0 for the database's default: 4 on SQLite, 10 on PostgreSQL.")
	fs.IntVar(&o.maxIdleConns, "registry-max-idle-conns", 0, "Most idle connections kept to the registry; 0 for the database's default: 4 on SQLite, 5 on PostgreSQL.")
	fs.DurationVar(&o.connMaxLifetime, "registry-conn-max-lifetime", 30*time.Minute,
		"Connections to the registry are replaced after this long, so a fail-over or a new server is picked up.")
	fs.StringVar(&o.owner, "registry-owner", "student-controller",
		"The owner this controller writes on its registry rows. It never changes or deletes rows of another owner.")
	fs.DurationVar(&o.sweepInterval, "sweep-interval", 5*time.Minute,
		"How often to compare the whole registry with the Students, repair drift and delete or release the rows without their Student. 0 turns it off: "+
			"then only the resync (--resync-period) finds rows that drifted.")
	fs.IntVar(&o.sweepMaxDeletions, "sweep-max-deletions", 100,
		"A sweep that would let go of (delete or release) more rows without their Student than this lets go of none and reports it.")
	fs.IntVar(&o.maxRewinds, "registry-max-rewinds", 100,
		"Rows found at a newer generation than their Students (after an etcd restore) that the controller takes back to its Students from its start; "+
			"past it such a row makes its Student not Ready (reason RegistryAhead), since so many looks like a cloned cluster sharing production's registry.")
	fs.StringVar(&o.markNamespace, "registry-mark-namespace", "",
		"Namespace of the ConfigMap LEASE-registry-mark (LEASE is --leader-elect-id), in which the cluster keeps the highest registry mark it has seen, "+
			"so that a registry put back in time (an older backup, a point-in-time recovery) is noticed. Defaults to the Lease's namespace "+
			"(--leader-elect-namespace), else the Pod's (POD_NAMESPACE), else kube-system with --leader-elect; without any, the mark is not kept.")
	fs.DurationVar(&o.lockWait, "registry-lock-wait", registry.DefaultLockWait,
		"Longest a registry write waits for a row that another session has locked (PostgreSQL), before it fails and is tried again; "+
			"the writes that share its transaction do not wait for it longer.")
	fs.DurationVar(&o.fenceLease, "registry-fence-lease", registry.DefaultLeaseDuration,
		"How long the registry's write fence for the owner stays this controller's without a renewal (renewed every third of it, in the registry's clock). "+
			"Another controller of the same owner (a cloned cluster, a second install) waits while it runs; a crashed holder's fence is taken over after it, "+
			"a stopped one's within a second.")
	fs.IntVar(&o.sweepMaxDeletionPercent, "sweep-max-deletion-percent", 50,
		"A sweep that would let go of more than this share of the rows the owner holds (at least one row) lets go of none and reports it.")
	fs.DurationVar(&o.historyRetention, "history-retention", 90*24*time.Hour,
		"How long the registry keeps its history rows (one per row written, in the student_history table); older ones are pruned every hour. 0 keeps them all.")
	fs.BoolVar(&o.sqliteShared, "sqlite-shared-file", false,
		"With --leader-elect and a SQLite registry: say that every replica opens the same file (one shared volume). Without it the "+
			"combination is refused, since replicas with a file each would split the registry.")
	fs.DurationVar(&o.resyncPeriod, "resync-period", resyncPeriod,
		"How often every cached Student is queued again even without a change: a backstop for what only a sync repairs, such as a status edited by hand. "+
			"Rows that are missing or differ are found by the sweep (--sweep-interval), which lists the owned rows and queues their Students; "+
			"with the sweep off this defaults to "+resyncWithoutSweep.String()+". 0 never.")
	fs.DurationVar(&o.syncTimeout, "sync-timeout", 30*time.Second, "Time limit of one sync; also bounds the drain on shutdown.")
	fs.StringVar(&o.rateLimiter, "workqueue-rate-limiter", "external-io",
		"Retry spacing: external-io (0.5 s doubling to 5 min, 50/s overall) or client-go (client-go's default: 5 milliseconds doubling to 16 min, 10/s overall; for comparison).")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 45*time.Second,
		"On SIGTERM, exit after at most this long even if work is still in flight. Keep it below the Pod's terminationGracePeriodSeconds.")

	fs.BoolVar(&o.dryRun, "dry-run", false,
		"Write nothing: no rows, finalizers, status, Events or Lease. Log what the controller would do (as student-controller plan lists it), "+
			"whenever the Students change and every --sweep-interval (every minute when 0), and count it in student_controller_dry_run_planned_actions. "+
			"The registry is opened read-only and must have been migrated by this controller's version; --leader-elect is ignored.")
	fs.BoolVar(&o.leaderElect, "leader-elect", false,
		"Run only while holding a coordination.k8s.io Lease, so that one of several replicas works at a time.")
	fs.StringVar(&o.leaderElectNamespace, "leader-elect-namespace", "",
		"Namespace of the Lease, and of the registry's mark (--registry-mark-namespace). Defaults to the Pod's namespace (POD_NAMESPACE), else kube-system.")
	fs.StringVar(&o.leaderElectID, "leader-elect-id", "student-controller",
		"Name of the Lease; the ConfigMap that keeps the registry's mark is named after it (NAME-registry-mark), with or without --leader-elect.")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second,
		"How long a standby waits, after the leader stops renewing, before taking over.")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second,
		"How long the leader keeps trying to renew before it gives up leading.")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", 2*time.Second, "How often to try to acquire or renew the Lease.")

	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus /metrics endpoint; 0 turns it off.")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", false,
		"Serve /metrics over HTTPS and allow only callers that the API server authenticates (TokenReview) and authorizes (SubjectAccessReview, get on the /metrics URL).")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints; 0 turns them off.")
	fs.StringVar(&o.tracingEndpoint, "tracing-endpoint", "",
		"OpenTelemetry collector to export traces to over OTLP/gRPC without TLS (HOST:PORT, e.g. localhost:4317): a span for each sync, "+
			"its queue wait, registry operations and status write, and the API requests within it, which kube-apiserver continues "+
			"when its own tracing is on. Off when empty, at no cost.")
	fs.IntVar(&o.tracingSamplingRate, "tracing-sampling-rate-per-million", 1000000,
		"Syncs traced, per million (1 to 1000000), with --tracing-endpoint.")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "0",
		"Address of Go's /debug/pprof/ profiling endpoints, e.g. 127.0.0.1:6060; 0 (the default) turns them off. They are not authenticated: bind them to localhost. The heap profile is sampled only while they are on.")
}

// addCommandFlags adds addFlags' flags and --version, which the registry subcommands lack.
func (o *options) addCommandFlags(fs *flag.FlagSet) {
	o.addFlags(fs)
	fs.BoolVar(&o.version, "version", false, "Print the version and exit.")
}

// registryPassword reads --registry-password-file, else REGISTRY_PASSWORD; nil for neither.
// The file is read per connection, so a rotated Secret applies without a restart.
func (o *options) registryPassword() func() (string, error) {
	if file := o.passwordFile; file != "" {
		return func() (string, error) {
			b, err := os.ReadFile(file) // #nosec G304 -- the file the operator names with --registry-password-file
			if err != nil {
				return "", fmt.Errorf("--registry-password-file: %w", err)
			}
			return strings.TrimRight(string(b), "\r\n"), nil
		}
	}
	if pw := os.Getenv("REGISTRY_PASSWORD"); pw != "" {
		return func() (string, error) { return pw, nil }
	}
	return nil
}

// recordSet notes which flags parsed fs was given, so validate can tell them from defaults.
func (o *options) recordSet(fs *flag.FlagSet) {
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
}

// The resync's default period, sweep on and off. A resync reads every cached Student's
// row, a sweep one List: with the sweep on the resync is a backstop; off, it finds drift.
const (
	resyncPeriod       = 10 * time.Hour
	resyncWithoutSweep = 10 * time.Minute
)

// parseRegistry parses --registry, once: every use of the registry takes the parsed URL.
func (o *options) parseRegistry() error {
	u, err := registry.ParseURL(o.registryURL)
	o.registry = u
	return err
}

// validate refuses flags that cannot work together and sets what depends on several.
func (o *options) validate() error {
	if o.sweepInterval == 0 && !o.set["resync-period"] {
		o.resyncPeriod = resyncWithoutSweep
	}
	var scopeErr error
	o.scope, scopeErr = controller.ParseScope(o.namespace, o.selector)
	registryErr := o.parseRegistry()
	invalid := tracingv1.ValidateTracingConfiguration(o.tracingConfig(), nil, field.NewPath("tracing"))
	sqlite := o.registry.SQLite()
	var errs []error
	for _, c := range []struct {
		bad bool
		err error
	}{
		{scopeErr != nil, fmt.Errorf("--namespace or --selector: %w", scopeErr)},
		{registryErr != nil, registryErr},
		{o.tracingEndpoint != "" && len(invalid) > 0, fmt.Errorf("--tracing-endpoint: %w", invalid.ToAggregate())},
		{o.workers < 1, fmt.Errorf("--workers must be at least 1, got %d", o.workers)},
		{o.qps <= 0 || o.burst < 1, fmt.Errorf("--kube-api-qps and --kube-api-burst must be positive, got %v and %d", o.qps, o.burst)},
		{o.owner == "", errors.New("--registry-owner must not be empty")},
		{o.sweepInterval < 0 || o.sweepMaxDeletions < 0 || o.resyncPeriod < 0 || o.historyRetention < 0,
			errors.New("--sweep-interval, --sweep-max-deletions, --resync-period and --history-retention must not be negative")},
		{o.lockWait <= 0, fmt.Errorf("--registry-lock-wait must be positive, got %v", o.lockWait)},
		{o.fenceLease < time.Second, fmt.Errorf("--registry-fence-lease must be at least 1s, got %v", o.fenceLease)},
		{o.maxRewinds < 1, fmt.Errorf("--registry-max-rewinds must be at least 1, got %d", o.maxRewinds)},
		{o.sweepMaxDeletionPercent < 1 || o.sweepMaxDeletionPercent > 100,
			fmt.Errorf("--sweep-max-deletion-percent must be within 1 and 100, got %d", o.sweepMaxDeletionPercent)},
		{o.registry.HasPassword(), errors.New("--registry holds a password, which would show in the process list, the Pod's spec and " +
			"the release's values: leave it out of the URL and give it with --registry-password-file (a mounted Secret; the " +
			"chart's registry.passwordSecret) or the REGISTRY_PASSWORD environment variable")},
		{sqlite && o.passwordFile != "", errors.New("--registry-password-file with a SQLite registry: SQLite takes no password")},
		{o.sqliteShared && !(sqlite && o.leaderElect), errors.New("--sqlite-shared-file is for --leader-elect with a SQLite registry")},
		{o.set["tracing-sampling-rate-per-million"] && o.tracingEndpoint == "",
			errors.New("--tracing-sampling-rate-per-million without --tracing-endpoint does nothing")},
		{o.tracingSamplingRate < 1 || o.tracingSamplingRate > 1000000,
			fmt.Errorf("--tracing-sampling-rate-per-million must be within 1 and 1000000, got %d", o.tracingSamplingRate)},
		{o.metricsSecure && o.metricsAddr == "0", errors.New("--metrics-secure with --metrics-bind-address=0: there is no metrics endpoint to secure")},
		// The Lease's namespace and name also place the registry's mark: allowed.
		{!o.leaderElect && o.set["leader-elect-lease-duration"], errors.New("--leader-elect-lease-duration without --leader-elect does nothing")},
		{!o.leaderElect && o.set["leader-elect-renew-deadline"], errors.New("--leader-elect-renew-deadline without --leader-elect does nothing")},
		{!o.leaderElect && o.set["leader-elect-retry-period"], errors.New("--leader-elect-retry-period without --leader-elect does nothing")},
		{o.leaderElect && sqlite && !o.sqliteShared, errors.New("--leader-elect with a SQLite registry: replicas with a file each would split the registry. " +
			"Run one replica without --leader-elect, use PostgreSQL, or say --sqlite-shared-file if every replica opens the same file")},
		{o.maxOpenConns < 0 || o.maxIdleConns < 0 || o.connMaxLifetime <= 0, errors.New("--registry-max-open-conns and --registry-max-idle-conns " +
			"must not be negative (0 takes the database's default), --registry-conn-max-lifetime must be positive")},
		{o.rateLimiter != "external-io" && o.rateLimiter != "client-go",
			fmt.Errorf("--workqueue-rate-limiter must be external-io or client-go, got %q", o.rateLimiter)},
		{o.syncTimeout <= 0 || o.shutdownTimeout <= 0, errors.New("--sync-timeout and --shutdown-timeout must be positive")},
		{o.leaderElect && !(o.leaseDuration > o.renewDeadline && o.renewDeadline > o.retryPeriod && o.retryPeriod > 0),
			fmt.Errorf("leader election needs --leader-elect-lease-duration (%v) > --leader-elect-renew-deadline (%v) > --leader-elect-retry-period (%v) > 0",
				o.leaseDuration, o.renewDeadline, o.retryPeriod)},
	} {
		if c.bad {
			errs = append(errs, c.err)
		}
	}
	return errors.Join(errs...)
}
