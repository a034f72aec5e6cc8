package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/decide"
	"github.com/student-controller/student-controller/internal/mark"
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// adoptOptions are adopt's own flags.
type adoptOptions struct {
	school           string
	createNamespaces bool
	max              int
	output           string
}

// adoptRows runs "student-controller registry adopt": it makes an observed Student for
// each row with none here and binds the row to it. Exit code: 2 when rows were left alone
// or (with --dry-run) would be adopted, 1 on error, else 0.
func adoptRows(ctx context.Context, opts options, ao adoptOptions, migrate bool, stdout, stderr io.Writer) (int, error) {
	if opts.dryRun && migrate {
		return 1, errors.New("--dry-run changes nothing, and --migrate would migrate the schema: give one of them")
	}
	if opts.selector != "" {
		return 1, errors.New("--selector: adopt makes Students of rows, which have no labels; choose rows with --namespace or --school")
	}
	c, err := commandClients(ctx, opts)
	// On a CRD without spec.management a Student would lose Observe, its row be written.
	if err = cmp.Or(err, c.crd); err != nil {
		return 1, err
	}
	reg, release, err := openRegistry(ctx, opts, !opts.dryRun, migrate)
	if err != nil {
		return 1, err
	}
	defer func() { release(); _ = reg.Close() }()
	// A registry put back in time holds rows of deleted Students: do not revive them.
	if err := mark.Behind(ctx, c.kube, markPlace(opts), opts.owner, reg, false); err != nil {
		return 1, fmt.Errorf("refused: %w", err)
	}
	// Rows are bound to this owner: it must be this cluster's (bound on first use).
	if opts.dryRun {
		if b, err := reg.BindingOf(ctx, opts.owner); err == nil && b.Cluster != c.id {
			return 1, fmt.Errorf("owner %q is bound to cluster %s, not this one (%s): %w", opts.owner, b.Cluster, c.id, registry.ErrOtherCluster)
		} else if err != nil && !errors.Is(err, registry.ErrNotFound) {
			return 1, err
		}
	} else if _, err := reg.Bind(ctx, opts.owner, c.id); err != nil {
		return 1, err
	}

	in := controller.AdoptInput{AdoptScope: decide.AdoptScope{Owner: opts.owner, Students: map[string]decide.ClusterStudent{},
		Namespaces: map[string]bool{}, CreateNamespaces: ao.createNamespaces, Max: ao.max}}
	rows, malformed, err := reg.ListAll(ctx)
	if err != nil {
		return 1, err
	}
	byUID := map[string]registry.Record{}
	for _, r := range rows {
		if opts.scope.Contains(r.Namespace) && (ao.school == "" || r.School == ao.school) {
			in.Rows, byUID[r.UID] = append(in.Rows, r), r
		}
	}
	all, err := listStudents(ctx, c.students, controller.Scope{})
	if err != nil {
		return 1, err
	}
	for _, s := range all {
		in.Students[s.Namespace+"/"+s.Name] = decide.ClusterStudent{UID: string(s.UID), RowUID: controller.RowUID(s),
			AdoptedFrom: s.Annotations[controller.AnnotationAdoptedFrom], Paused: s.Annotations[studentv1.AnnotationPaused] == "true"}
	}
	namespaces, err := c.kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 1, fmt.Errorf("list namespaces: %w", err)
	}
	for _, ns := range namespaces.Items {
		in.Namespaces[ns.Name] = true
	}
	plan := controller.PlanAdoption(in)

	progress := stdout
	if ao.output == "json" {
		progress = stderr
		if err := writeJSON(stdout, &plan.Actions, &plan); err != nil {
			return 1, err
		}
	} else {
		printAdoption(stdout, reg.String(), opts.owner, plan, len(malformed))
	}
	refused := len(plan.Actions) - plan.Changes() + len(malformed)
	if opts.dryRun || plan.Changes() == 0 {
		return twoIf(plan.Changes() > 0 || refused > 0), nil
	}

	a := adopter{reg: reg, kube: c.kube, students: c.students, owner: opts.owner}
	done, total, last := 0, plan.Changes(), time.Now()
	for _, act := range plan.Actions {
		if act.Action == controller.PlanRefuse {
			continue
		}
		if err := a.adopt(ctx, act, plan.Steps[act.UID], byUID[act.UID]); err != nil {
			return 1, fmt.Errorf("%d of %d adopted; %s/%s (row %s): %w", done, total, act.Namespace, act.Name, act.UID, err)
		}
		done++
		if time.Since(last) >= 5*time.Second || done == total {
			fmt.Fprintf(progress, "adopted %d of %d\n", done, total)
			last = time.Now()
		}
	}
	return twoIf(refused > 0), nil
}

// adopter makes the Student of a row and binds the row to it.
type adopter struct {
	reg      *registry.Registry
	kube     kubernetes.Interface
	students versioned.Interface
	owner    string
}

// adopt carries out one step of the plan. The Student is made paused, so the controller
// leaves it alone until its row is bound, then unpaused. The next run finishes a run cut
// short (the Student names its row's former uid).
func (a *adopter) adopt(ctx context.Context, act controller.PlannedAction, step decide.Adoption, row registry.Record) error {
	switch step.Step {
	case decide.AdoptFinish:
		return a.unpause(ctx, act.Namespace, act.Name)
	case decide.AdoptRebind:
		return a.rebind(ctx, act, row)
	case decide.AdoptMake, decide.AdoptResume:
	default:
		return fmt.Errorf("no step to adopt row %s with (%s)", row.UID, act.Action)
	}
	if step.Observe {
		// Until bound, the sweep takes this row for an orphan; an observed row it leaves.
		if err := a.reg.MarkObserved(ctx, row.UID, a.owner); err != nil {
			return fmt.Errorf("mark the row observed: %w", err)
		}
	}
	if step.CreateNamespace {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: act.Namespace}}
		if _, err := a.kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create namespace: %w", err)
		}
	}
	s, err := a.student(ctx, step, row)
	if err != nil {
		return err
	}
	err = a.reg.Adopt(ctx, row.UID, registry.Record{UID: string(s.UID), Namespace: s.Namespace, Name: s.Name, Owner: a.owner,
		Generation: s.Generation, DeletionPolicy: string(s.Spec.DeletionPolicy), Management: registry.ManagementObserve}, registry.CauseAdopted)
	if err != nil {
		return fmt.Errorf("bind the row to Student %s: %w", s.UID, err)
	}
	return a.unpause(ctx, act.Namespace, act.Name)
}

// student makes the paused Student of row, or gets the one a run cut short made.
func (a *adopter) student(ctx context.Context, step decide.Adoption, row registry.Record) (*studentv1.Student, error) {
	students := a.students.BolingcavalryV1().Students(row.Namespace)
	if step.Step == decide.AdoptResume {
		return students.Get(ctx, row.Name, metav1.GetOptions{})
	}
	s := &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Namespace: row.Namespace, Name: row.Name, Annotations: map[string]string{
			controller.AnnotationAdoptedFrom: row.UID, studentv1.AnnotationPaused: "true", studentv1.AnnotationRowUID: row.UID}},
		Spec: decide.AdoptedSpec(row),
	}
	created, err := students.Create(ctx, s, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create Student: %w", err)
	}
	return created, nil
}

// rebind binds the row again to the Student that names it, as the Student stands, and asks
// for a sync: nothing else brings back a Student the controller refused.
func (a *adopter) rebind(ctx context.Context, act controller.PlannedAction, row registry.Record) error {
	s, err := a.students.BolingcavalryV1().Students(act.Namespace).Get(ctx, act.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	err = a.reg.Adopt(ctx, row.UID, registry.Record{UID: string(s.UID), Namespace: s.Namespace, Name: s.Name, Owner: a.owner,
		Generation: s.Generation, DeletionPolicy: string(decide.SpecPolicy(s.Spec)), Management: decide.RowManagement(s.Spec)}, registry.CauseRebound)
	if err != nil {
		return fmt.Errorf("bind the row to Student %s: %w", s.UID, err)
	}
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, studentv1.AnnotationReconcileRequestedAt, time.Now().UTC().Format(time.RFC3339Nano))
	if _, err := a.students.BolingcavalryV1().Students(act.Namespace).Patch(ctx, act.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("ask for a sync of the Student (annotate %s): %w", studentv1.AnnotationReconcileRequestedAt, err)
	}
	return nil
}

// unpause drops the paused and adopted-from annotations, so no later run unpauses it again.
func (a *adopter) unpause(ctx context.Context, namespace, name string) error {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null,%q:null}}}`, studentv1.AnnotationPaused, controller.AnnotationAdoptedFrom)
	if _, err := a.students.BolingcavalryV1().Students(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("let the adopted Student go (remove %s): %w", studentv1.AnnotationPaused, err)
	}
	return nil
}

func printAdoption(w io.Writer, reg, owner string, p controller.AdoptionPlan, malformed int) {
	fmt.Fprintf(w, "Registry %s, owner %q: %d rows compared, %d with their Student here\n", reg, owner, p.Rows, p.WithStudent)
	printActions(w, p.Actions)
	if malformed > 0 {
		fmt.Fprintf(w, "%d rows cannot be read and are left alone.\n", malformed)
	}
	if p.Refused {
		fmt.Fprintf(w, "Refused: more rows to adopt than one run adopts (%d); none is. Narrow them (--namespace, --school) or raise --max-adoptions.\n", p.Bound)
	}
	fmt.Fprintf(w, "%d to adopt as observed Students or bind again.\n", p.Changes())
}
