package mark

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/registry"
	_ "modernc.org/sqlite"
)

// TestMarkKeeper: the cluster keeps the highest mark it has seen the registry at. A
// registry put back below it is behind, and stays so as its mark climbs again, until
// an operator confirms with the annotation; prune refuses meanwhile.
func TestMarkKeeper(t *testing.T) {
	ctx := context.Background()
	reg, db := fencedSQLite(t)

	client := fake.NewClientset()
	promReg := prometheus.NewRegistry()
	recorder := record.NewFakeRecorder(10)
	place := Place{Namespace: "system", Name: "student-controller-registry-mark", Given: true}
	namespace, name := place.Namespace, place.Name
	k := &Keeper{Client: client, Place: place, Owner: "stu", Registry: reg,
		Gauge: controller.NewMetrics(promReg), Recorder: recorder, Pod: podRef()}
	sweeps := 0
	k.Sweeper = sweepFunc(func() { sweeps++ })
	if k.Behind() == nil {
		t.Error("Behind before the first check: nil, want an error (not compared yet)")
	}
	// prune deletes nothing on a registry whose mark it cannot find.
	if err := Behind(ctx, client, Place{Name: name}, "stu", reg, true); err == nil {
		t.Error("prune's check with no namespace for the mark: nil, want a refusal")
	}
	if err := Behind(ctx, client, place, "stu", reg, true); err == nil || !strings.Contains(err.Error(), "no ConfigMap") {
		t.Errorf("prune's check before any controller kept a mark: %v, want a refusal", err)
	}
	// adopt goes on where no mark is kept yet: a cluster rebuilt adopts before its
	// controller runs. Without a namespace it looks for the mark by its label.
	anywhere := Place{Name: name}
	for _, o := range []Place{anywhere, place} {
		if err := Behind(ctx, client, o, "stu", reg, false); err != nil {
			t.Errorf("adopt's check before any controller kept a mark (namespace %q): %v, want nil", o.Namespace, err)
		}
	}
	check := func(wantBehind bool) {
		t.Helper()
		if err := k.Check(ctx); err != nil {
			t.Fatal(err)
		}
		if err := k.Behind(); (err != nil) != wantBehind {
			t.Fatalf("Behind: %v, want behind %v", err, wantBehind)
		}
		want := map[bool]float64{false: 0, true: 1}[wantBehind]
		if got := gauge(t, promReg, "student_controller_registry_behind"); got != want {
			t.Errorf("student_controller_registry_behind %v, want %v", got, want)
		}
	}
	data := func() map[string]string {
		t.Helper()
		cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data
	}
	check(false)
	check(false)
	check(false)
	if got := data(); got["owner"] != "stu" || got["mark"] != "3" || got["behind"] != "" {
		t.Fatalf("the ConfigMap after three checks: %v; want owner stu, mark 3", got)
	}
	if err := Behind(ctx, client, place, "stu", reg, true); err != nil {
		t.Errorf("prune's check while the registry is level: %v", err)
	}
	if said, err := Confirm(ctx, client, place, "stu", reg); err != nil || !strings.Contains(said, "nothing to confirm") {
		t.Errorf("confirm-restore while the registry is level: %q, %v; want nothing to confirm", said, err)
	}
	if cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{}); err != nil || len(cm.Annotations) != 0 {
		t.Errorf("the ConfigMap after confirming a level registry: %v, %v; want no annotation", cm.Annotations, err)
	}

	// An older backup put back: the registry's mark is 1 again.
	if _, err := db.Exec(`UPDATE fences SET mark = 1 WHERE owner = 'stu'`); err != nil {
		t.Fatal(err)
	}
	check(true)
	if err := k.Behind(); !strings.Contains(err.Error(), "mark is 1, below the 3") || !strings.Contains(err.Error(), AnnotationBehindConfirmed+"=3") {
		t.Errorf("Behind says %q; want both marks and the command that confirms", err)
	}
	if events := drain(recorder); len(events) != 1 || !strings.HasPrefix(events[0], "Warning RegistryBehind") {
		t.Errorf("Events: %q, want one RegistryBehind", events)
	}
	// Later checks say it again, without an Event, and leave the registry's mark
	// where it is: a check that advanced it could creep past the cluster's.
	check(true)
	check(true)
	check(true)
	if at, err := reg.ReadMark(ctx, "stu"); err != nil || at != 1 {
		t.Errorf("the registry's mark while behind: %d, %v; want 1, not advanced", at, err)
	}
	if events := drain(recorder); len(events) != 0 {
		t.Errorf("Events on later checks: %q, want none", events)
	}
	if got := data(); got["mark"] != "3" || got["behind"] != "1" {
		t.Errorf("the ConfigMap while behind: %v; want mark 3, behind 1", got)
	}
	if err := Behind(ctx, client, place, "stu", reg, true); err == nil || !strings.Contains(err.Error(), "mark is 1, below the 3") {
		t.Errorf("prune's check while behind: %v; want a refusal naming both marks", err)
	}
	for _, o := range []Place{anywhere, place} {
		if err := Behind(ctx, client, o, "stu", reg, false); err == nil || !strings.Contains(err.Error(), "mark is 1, below the 3") {
			t.Errorf("adopt's check while behind (namespace %q): %v; want a refusal naming both marks", o.Namespace, err)
		}
	}

	// A confirmation for another mark does nothing; the right one (as confirm-restore
	// writes it) clears it.
	annotate := func(value string) {
		t.Helper()
		cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Annotations = map[string]string{AnnotationBehindConfirmed: value}
		if _, err := client.CoreV1().ConfigMaps(namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	annotate("2")
	check(true)
	// registry confirm-restore: the annotation with the cluster's mark, once.
	if said, err := Confirm(ctx, client, place, "stu", reg); err != nil || !strings.Contains(said, "confirmed the registry as it is at the cluster's mark 3") {
		t.Errorf("confirm-restore while behind: %q, %v; want it confirmed at 3", said, err)
	}
	if said, err := Confirm(ctx, client, place, "stu", reg); err != nil || !strings.Contains(said, "confirmed already") {
		t.Errorf("confirm-restore again: %q, %v; want confirmed already", said, err)
	}
	if err := Behind(ctx, client, place, "stu", reg, true); err != nil {
		t.Errorf("prune's check once confirmed: %v", err)
	}
	if err := Behind(ctx, client, anywhere, "stu", reg, false); err != nil {
		t.Errorf("adopt's check once confirmed: %v", err)
	}
	check(false)
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["behind"] != "" || cm.Data["mark"] != "2" || cm.Annotations[AnnotationBehindConfirmed] != "" {
		t.Errorf("the ConfigMap once confirmed: %v %v; want mark 2, no behind, no annotation", cm.Data, cm.Annotations)
	}
	if events := drain(recorder); len(events) != 1 || !strings.HasPrefix(events[0], "Normal RegistryBehindConfirmed") {
		t.Errorf("Events: %q, want one RegistryBehindConfirmed", events)
	}
	if sweeps != 1 {
		t.Errorf("sweeps asked for on confirmation: %d, want 1 (the rows kept may go now)", sweeps)
	}

	// A ConfigMap of another owner is this owner's from now on, not a mark to be
	// behind of.
	other := &Keeper{Client: client, Place: place, Owner: "other", Registry: reg, Recorder: recorder}
	if err := other.Check(ctx); err != nil || other.Behind() != nil {
		t.Errorf("another owner's first check: %v, %v", err, other.Behind())
	}
}

func podRef() *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Pod", Namespace: "system", Name: "student-controller-0"}
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func drain(r *record.FakeRecorder) []string {
	var events []string
	for {
		select {
		case e := <-r.Events:
			events = append(events, e)
		default:
			return events
		}
	}
}

// TestMarkKeeperReadiness: RBAC that refuses the ConfigMap makes the Pod not ready,
// saying so; a registry that does not answer does not, since readiness never asks the
// registry.
func TestMarkKeeperReadiness(t *testing.T) {
	ctx := context.Background()
	reg, err := registry.Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "registry.db"), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.TakeFence(ctx, "stu"); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset()
	forbid := true
	client.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if forbid {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "student-controller-registry-mark", errors.New("RBAC"))
		}
		return false, nil, nil
	})
	k := &Keeper{Client: client, Place: Place{Namespace: "system", Name: "student-controller-registry-mark"}, Owner: "stu", Registry: reg,
		Recorder: record.NewFakeRecorder(10)}
	if err := k.Check(ctx); err == nil || k.Ready() == nil || !strings.Contains(k.Ready().Error(), "forbidden") {
		t.Errorf("a check RBAC refuses: %v; Ready %v, want not ready, saying forbidden", err, k.Ready())
	}
	forbid = false
	if err := k.Check(ctx); err != nil || k.Ready() != nil {
		t.Errorf("a check once RBAC allows it: %v; Ready %v, want ready", err, k.Ready())
	}
	reg.Close() // the registry stops answering
	if err := k.Check(ctx); err == nil || k.Ready() != nil {
		t.Errorf("a check while the registry is down: %v; Ready %v, want an error and still ready", err, k.Ready())
	}
}

// TestMarkKeeperBehindNotRecorded: a registry put back behind the cluster's mark stays
// behind while the record of that in the cluster fails: the keeper advances the
// registry's mark only once it is not behind, so retries cannot creep past the
// cluster's mark and call a registry that lost writes level.
func TestMarkKeeperBehindNotRecorded(t *testing.T) {
	ctx := context.Background()
	reg, db := fencedSQLite(t)
	client := fake.NewClientset()
	k := &Keeper{Client: client, Place: Place{Namespace: "system", Name: "student-controller-registry-mark"}, Owner: "stu", Registry: reg,
		Recorder: record.NewFakeRecorder(100)}
	for range 3 {
		if err := k.Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// An older backup put back, and the cluster refuses the record of it for a while.
	if _, err := db.Exec(`UPDATE fences SET mark = 1 WHERE owner = 'stu'`); err != nil {
		t.Fatal(err)
	}
	refuse := true
	client.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse {
			return true, nil, apierrors.NewServiceUnavailable("the API server is restarting")
		}
		return false, nil, nil
	})
	for range 5 {
		if err := k.Check(ctx); err == nil {
			t.Fatal("a check whose record fails: nil, want its error")
		}
	}
	refuse = false
	if err := k.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if err := k.Behind(); err == nil {
		t.Error("Behind after the record failed five times: nil, want the registry behind")
	}
}

// fencedSQLite is a SQLite registry whose write fence of owner stu it holds, and a
// connection of its own to the same file, for what the test does behind its back.
func fencedSQLite(t *testing.T) (*registry.Registry, *sql.DB) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "registry.db")
	reg, err := registry.Open(context.Background(), "sqlite://"+path, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	if _, err := reg.TakeFence(context.Background(), "stu"); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return reg, db
}

// sweepFunc is a Sweeper of a function.
type sweepFunc func()

func (f sweepFunc) SweepSoon() { f() }
