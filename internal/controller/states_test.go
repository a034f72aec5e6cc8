package controller

import (
	"maps"
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// running says which keys have a clock running.
func (g *newGenerations) running() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Sorted(maps.Keys(g.at))
}

// latencies returns the sync latency histogram's count and sum.
func latencies(t *testing.T, m *Metrics) (uint64, float64) {
	t.Helper()
	var out dto.Metric
	if err := m.syncLatency.Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetHistogram().GetSampleCount(), out.GetHistogram().GetSampleSum()
}

func TestSyncLatency(t *testing.T) {
	t.Run("from the watch event of a new Student to its status reported Ready", func(t *testing.T) {
		f := newFixture(t, newStudent("a", withFinalizer))
		f.ctrl.observeEvent(compactStudent(f.get("school", "a")))
		f.clock.Step(1500 * time.Millisecond)
		if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
			t.Fatal(err)
		}
		if n, sum := latencies(t, f.metrics); n != 1 || sum != 1.5 {
			t.Errorf("latency: %d observations, %v s in all; want 1 of 1.5 s", n, sum)
		}
		// The status write's own watch event finds the generation Ready: no new clock,
		// and a second sync observes nothing.
		f.ctrl.observeEvent(compactStudent(f.get("school", "a")))
		if err := f.ctrl.sync(f.ctx, "school/a"); err != nil {
			t.Fatal(err)
		}
		if n, _ := latencies(t, f.metrics); n != 1 {
			t.Errorf("latency: %d observations after a sync with nothing new; want 1", n)
		}
		if running := f.ctrl.states.generations.running(); len(running) != 0 {
			t.Errorf("clocks still running: %v", running)
		}
	})

	t.Run("a spec change starts a clock; a Student that cannot be Ready keeps it until it is deleted", func(t *testing.T) {
		f := newFixture(t, newStudent("a", withFinalizer, synced(start)))
		f.ctrl.observeEvent(compactStudent(f.get("school", "a")))
		if running := f.ctrl.states.generations.running(); len(running) != 0 {
			t.Fatalf("a Student Ready at its generation started a clock: %v", running)
		}
		s := f.get("school", "a")
		s.Generation, s.Spec.School = 2, "" // the CRD refuses this now; stored before it did
		if _, err := f.client.BolingcavalryV1().Students("school").Update(f.ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.observe("school", "a")
		f.ctrl.observeEvent(compactStudent(f.get("school", "a")))
		_ = f.ctrl.sync(f.ctx, "school/a") // refused: invalid spec
		if n, _ := latencies(t, f.metrics); n != 0 {
			t.Errorf("latency observed for a Student that is not Ready")
		}
		if running := f.ctrl.states.generations.running(); !slices.Equal(running, []string{"school/a"}) {
			t.Errorf("clocks running: %v; want school/a's", running)
		}
		f.ctrl.states.forget("school/a") // as its deletion does
		if running := f.ctrl.states.generations.running(); len(running) != 0 {
			t.Errorf("clocks still running after the Student went: %v", running)
		}
	})
}

func TestNewGenerations(t *testing.T) {
	at := func(s int) time.Time { return start.Add(time.Duration(s) * time.Second) }
	var g newGenerations

	g.seen("a", 1, false, false, at(0))
	g.seen("a", 1, false, false, at(5)) // the same generation again: its clock runs on
	if took, ok := g.reported("a", 1, at(7)); !ok || took != 7*time.Second {
		t.Errorf("reported = %v, %v; want 7s from the first event", took, ok)
	}

	g.seen("b", 1, false, false, at(0))
	g.seen("b", 2, false, false, at(4)) // newer: a clock of its own
	if _, ok := g.reported("b", 1, at(5)); ok {
		t.Error("a report of generation 1 stopped generation 2's clock")
	}
	if took, ok := g.reported("b", 2, at(6)); !ok || took != 2*time.Second {
		t.Errorf("reported = %v, %v; want 2s from generation 2's event", took, ok)
	}

	g.seen("c", 3, false, false, at(0))
	g.seen("c", 3, true, false, at(1)) // reported by the leader: this standby stops it
	g.seen("d", 1, false, false, at(0))
	g.seen("d", 2, false, true, at(1)) // paused or deleted: not timed
	if _, ok := g.reported("c", 3, at(2)); ok {
		t.Error("a clock stopped by a Ready event was observed")
	}
	if g.at != nil {
		t.Errorf("clocks left: %v; want the map dropped once empty", g.at)
	}
}

// The Ready condition of the cache's compact Student, at its generation.
func TestCachedStudentIsReady(t *testing.T) {
	for name, tc := range map[string]struct {
		s    *studentv1.Student
		want bool
	}{
		"no status":         {newStudent("a"), false},
		"Ready":             {newStudent("a", synced(start)), true},
		"Ready, older spec": {newStudent("a", synced(start), func(s *studentv1.Student) { s.Generation = 2 }), false},
		"not Ready": {newStudent("a", synced(start), func(s *studentv1.Student) {
			s.Status.Conditions[0].Status = metav1.ConditionFalse
		}), false},
		"Ready among three conditions": {newStudent("a", synced(start), func(s *studentv1.Student) {
			s.Status.Conditions = append([]metav1.Condition{{Type: "A"}, {Type: "B"}}, s.Status.Conditions...)
		}), true},
	} {
		if got := compactStudent(tc.s).isReady(); got != tc.want {
			t.Errorf("%s: isReady = %v, want %v", name, got, tc.want)
		}
	}
}
