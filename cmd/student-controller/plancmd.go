package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/mark"
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

const planUsage = `Usage:
  student-controller plan [-o table|json] [the controller's flags]

plan lists what the controller, started with the same flags, would do now: the rows it
would create, update, restore, delete or release, the Students whose finalizer alone
would come off, the Students it would refuse and why, and whether its sweep's guard
would refuse to let go of the rows whose Students are gone. It writes nothing anywhere:
the registry is opened read-only and the API server is only read.

Exit status: 0 when nothing would change, 2 when something would, 1 on an error
(bad flags, a registry or API server out of reach, the owner bound to another cluster).
`

// planCommand runs "student-controller plan ...". It returns the process's exit code.
func planCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, planUsage, "\nFlags:\n")
		fs.PrintDefaults()
	}
	var opts options
	opts.addCommandFlags(fs)
	addLoggingFlags(fs) // the controller's, accepted so that its arguments can be copied; plan logs nothing
	output := fs.String("o", "table", "Output format: table, for people, or json, for scripts.")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return 0
	} else if err != nil {
		return 1
	}
	if opts.version {
		fmt.Fprintln(stdout, versionString())
		return 0
	}
	opts.recordSet(fs)
	if fs.NArg() > 0 || (*output != "table" && *output != "json") {
		fs.Usage()
		return 1
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	report, err := planReport{}, opts.validate()
	if err == nil {
		report, err = makePlan(ctx, opts)
	}
	if err == nil && *output == "json" {
		err = writeJSON(stdout, &report.Actions, &report)
	} else if err == nil {
		printPlan(stdout, report)
	}
	if err != nil {
		fmt.Fprintf(stderr, "student-controller plan: %v\n", err)
		return 1
	}
	return twoIf(report.Changes() > 0)
}

// writeJSON writes v indented, for scripts; actions, if nil, become [] rather than null.
func writeJSON(w io.Writer, actions *[]controller.PlannedAction, v any) error {
	if *actions == nil {
		*actions = []controller.PlannedAction{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// twoIf is plan's and adopt's exit code: 2 when cond (a change, rows left alone), else 0.
func twoIf(cond bool) int {
	if cond {
		return 2
	}
	return 0
}

// planReport is a plan with what it compared.
type planReport struct {
	controller.Plan
	Registry       string `json:"registry"`
	Owner          string `json:"owner"`
	Cluster        string `json:"cluster"`
	Scope          string `json:"scope"`                    // the controller's --namespace and --selector, for people
	NoSchema       bool   `json:"noSchema,omitempty"`       // the registry has no schema yet, so every row is new
	RegistryBehind string `json:"registryBehind,omitempty"` // why the registry is behind the cluster's mark, if it is
	MarkUnread     string `json:"markUnread,omitempty"`     // why the mark could not be compared, if it could not
}

func makePlan(ctx context.Context, opts options) (planReport, error) {
	report := planReport{Owner: opts.owner, Scope: opts.scope.String()}
	c, err := commandClients(ctx, opts)
	var tooOld *controller.CRDTooOldError // planned for (CRDOlder); other errors fail
	if err = cmp.Or(err, c.crd); err != nil && !errors.As(err, &tooOld) {
		return report, err
	}
	var rows readOnlyRegistry
	switch r, err := registry.OpenToRead(ctx, opts.registry, opts.owner, c.id, registry.Options{Password: opts.registryPassword(), MaxOpenConns: opts.maxOpenConns}); {
	case errors.Is(err, registry.ErrNoSchema):
		rows, report.NoSchema = noSchema{display: opts.registry.String()}, true
	case err != nil:
		return report, err
	default:
		defer r.Close()
		rows = r
	}
	report.Registry, report.Cluster = rows.String(), c.id
	// Compared only where the controller would keep the mark; a plan goes on without it.
	var behind *mark.BehindError
	if place := markPlace(opts); place.Namespace != "" {
		if err := mark.Behind(ctx, c.kube, place, opts.owner, rows, false); errors.As(err, &behind) {
			report.RegistryBehind = behind.Error()
		} else if err != nil {
			report.MarkUnread = err.Error()
		}
	}

	all, err := listStudents(ctx, c.students, opts.scope)
	if err != nil {
		return report, err
	}
	report.Plan, err = controller.PlanFor(ctx, rows, controller.PlanScope{Scope: opts.scope, PlanPolicy: controller.PlanPolicy{
		Owner: opts.owner, SweepMaxDeletions: opts.sweepMaxDeletions, SweepMaxDeletionPercent: opts.sweepMaxDeletionPercent,
		NoSweep: opts.sweepInterval == 0, MaxUndo: opts.maxRewinds, CRDOlder: c.crd != nil, RegistryBehind: behind != nil},
		Exists: c.studentThere}, all)
	return report, err
}

// clusterClients are a subcommand's clients of the cluster, its id and CheckCRD's word.
type clusterClients struct {
	kube     kubernetes.Interface
	students versioned.Interface
	id       string
	crd      error
}

func commandClients(ctx context.Context, opts options) (clusterClients, error) {
	var c clusterClients
	cfg, err := clientcmd.BuildConfigFromFlags(opts.master, opts.kubeconfig)
	if err != nil {
		return c, fmt.Errorf("build client config: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(opts.qps), opts.burst
	crds, err := dynamic.NewForConfig(cfg)
	if err == nil {
		c.kube, err = kubernetes.NewForConfig(cfg)
	}
	if err == nil {
		c.students, err = versioned.NewForConfig(cfg)
	}
	if err == nil {
		c.id, err = clusterID(ctx, c.kube)
	}
	if err == nil {
		c.crd = controller.CheckCRD(ctx, crds)
	}
	return c, err
}

// listStudents lists the Students of scope, filtered by the API server like the informers.
func listStudents(ctx context.Context, client versioned.Interface, scope controller.Scope) ([]*studentv1.Student, error) {
	namespaces := scope.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	list := metav1.ListOptions{Limit: 500}
	if scope.Labeled() {
		list.LabelSelector = scope.Selector.String()
	}
	var all []*studentv1.Student
	for _, ns := range namespaces {
		list.Continue = ""
		for more := true; more; more = list.Continue != "" {
			page, err := client.BolingcavalryV1().Students(ns).List(ctx, list)
			if err != nil {
				return nil, fmt.Errorf("list Students: %w", err)
			}
			for i := range page.Items {
				all = append(all, &page.Items[i])
			}
			list.Continue = page.Continue
		}
	}
	return all, nil
}

func printPlan(w io.Writer, r planReport) {
	fmt.Fprintf(w, "Registry %s, owner %q, cluster %s, %s: %d Students, %d rows of the owner", r.Registry, r.Owner, r.Cluster, r.Scope, r.Students, r.Rows)
	if r.NoSchema {
		fmt.Fprint(w, " (the registry has no schema yet: the controller makes it when it first starts)")
	}
	fmt.Fprintln(w)
	if r.MarkUnread != "" {
		fmt.Fprintf(w, "Planned as on a registry in step with the cluster's mark, which was not compared: %s\n", r.MarkUnread)
	}
	if r.RegistryBehind != "" {
		fmt.Fprintf(w, "The registry is behind: %s\n", r.RegistryBehind)
	}
	printActions(w, r.Actions)
	if r.SweepRefused {
		fmt.Fprintf(w, "The sweep would refuse: %d rows of the owner have no Student, more than it lets go at once (%d); it would let go of none.\n", r.Orphans, r.SweepBound)
	}
	if r.Paused > 0 {
		fmt.Fprintf(w, "%d Students are paused (%s): nothing is planned for them.\n", r.Paused, studentv1.AnnotationPaused)
	}
	if r.Prunable > 0 {
		fmt.Fprintf(w, "%d rows were released without their Students while their policy was Delete: kept; "+
			"student-controller registry prune deletes them when asked.\n", r.Prunable)
	}
	if r.Malformed > 0 {
		fmt.Fprintf(w, "%d rows of the owner cannot be read: the syncs of their Students rewrite them, and the others are left alone.\n", r.Malformed)
	}
	switch n := r.Changes(); n {
	case 0:
		fmt.Fprintln(w, "Nothing would change.")
	case 1:
		fmt.Fprintln(w, "1 change.")
	default:
		fmt.Fprintf(w, "%d changes.\n", n)
	}
}

// printActions writes the actions of a plan or an adoption plan as a table, if any.
func printActions(w io.Writer, actions []controller.PlannedAction) {
	if len(actions) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tNAMESPACE\tNAME\tUID\tCAUSE")
	for _, a := range actions {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.Action, a.Namespace, a.Name, a.UID, a.Cause)
	}
	_ = tw.Flush()
}

// readOnlyRegistry is what a plan reads of the registry.
type readOnlyRegistry interface {
	Get(ctx context.Context, uid string) (registry.Record, error)
	List(ctx context.Context, owner string) ([]registry.Record, []registry.MalformedRow, error)
	ListReleased(ctx context.Context, owner string) ([]registry.Record, []registry.MalformedRow, error)
	LastHistory(ctx context.Context, namespace, name, uid string) (registry.HistoryEntry, bool, error)
	CheckSchema(ctx context.Context) error
	ReadMark(ctx context.Context, owner string) (int64, error)
	String() string
}

// noSchema is a registry with no schema yet (a new database or SQLite file): no rows.
type noSchema struct{ display string }

func (noSchema) Get(context.Context, string) (registry.Record, error) {
	return registry.Record{}, registry.ErrNotFound
}

func (noSchema) List(context.Context, string) ([]registry.Record, []registry.MalformedRow, error) {
	return nil, nil, nil
}

func (noSchema) ListReleased(context.Context, string) ([]registry.Record, []registry.MalformedRow, error) {
	return nil, nil, nil
}

func (noSchema) LastHistory(context.Context, string, string, string) (registry.HistoryEntry, bool, error) {
	return registry.HistoryEntry{}, false, nil
}

func (noSchema) CheckSchema(context.Context) error               { return nil }
func (noSchema) ReadMark(context.Context, string) (int64, error) { return 0, nil }
func (n noSchema) String() string                                { return n.display + " (no schema yet)" }
