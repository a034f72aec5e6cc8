package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// states are what the controller keeps of its Students between syncs, for the metrics.
// Only what is out of line is kept, so they cost nothing while all is well.
type states struct {
	mu          sync.Mutex
	notReady    map[string]struct{}
	drifted     map[string]struct{}
	pausedSince map[string]time.Time
	generations newGenerations
}

func newStates() *states {
	return &states{notReady: map[string]struct{}{}, drifted: map[string]struct{}{}, pausedSince: map[string]time.Time{}}
}

// synced records whether key's Student is Ready after its sync and, if known, drifted.
// Drift is counted apart from not Ready: it is what observing reports, not a fault.
func (s *states) synced(key string, ready bool, drifted *bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	mark(s.notReady, key, !ready)
	if drifted != nil {
		mark(s.drifted, key, *drifted)
	}
}

func mark(set map[string]struct{}, key string, in bool) {
	if in {
		set[key] = struct{}{}
	} else {
		delete(set, key)
	}
}

// paused records that key's Student is paused since then; unpaused, that it is not.
func (s *states) paused(key string, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pausedSince[key] = since
}

func (s *states) unpaused(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pausedSince, key)
}

// forget drops a Student gone or being deleted from the not-Ready and drifted sets and
// the latency clocks, and one that is gone from the paused ones.
func (s *states) forget(key string) {
	s.synced(key, true, new(false))
	s.unpaused(key)
	s.generations.forget(key)
}

func (s *states) counts() (notReady, drifted, paused int, oldest time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, since := range s.pausedSince {
		if oldest.IsZero() || since.Before(oldest) {
			oldest = since
		}
	}
	return len(s.notReady), len(s.drifted), len(s.pausedSince), oldest
}

// newGenerations times each generation from the watch event that brings it to the sync
// reporting it Ready (student_controller_sync_latency_seconds); a newer one replaces it.
// Only unreported ones are kept; the map is dropped when empty, as Go maps never shrink.
type newGenerations struct {
	mu sync.Mutex
	at map[string]seenGeneration
}

type seenGeneration struct {
	generation int64
	at         time.Time
}

// seen records a watch event of key's Student. A generation not yet Ready starts a clock
// unless one runs for it; Ready (reported here, or by the leader while this replica stands
// by) stops it unobserved. Paused or deleting Students are not timed: nothing is promised.
func (g *newGenerations) seen(key string, generation int64, ready, untimed bool, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.at[key]
	switch {
	case untimed || ready:
		if ok && (untimed || p.generation <= generation) {
			g.drop(key)
		}
	case !ok || p.generation < generation:
		if g.at == nil {
			g.at = map[string]seenGeneration{}
		}
		g.at[key] = seenGeneration{generation: generation, at: now}
	}
}

// reported stops key's clock when a sync reports generation Ready, and says how long it
// ran: false if no clock of it or an older one ran.
func (g *newGenerations) reported(key string, generation int64, now time.Time) (time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.at[key]
	if !ok || p.generation > generation {
		return 0, false
	}
	g.drop(key)
	return now.Sub(p.at), true
}

func (g *newGenerations) forget(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.drop(key) // the map is nil whenever it is empty, so dropping a key it lacks changes nothing
}

func (g *newGenerations) drop(key string) {
	delete(g.at, key)
	if len(g.at) == 0 {
		g.at = nil
	}
}

// isReady says whether the Student's status reports it Ready at its generation.
func (c *cachedStudent) isReady() bool {
	cond := meta.FindStatusCondition(c.statusConditions(), studentv1.ConditionReady)
	return cond != nil && cond.Status == metav1.ConditionTrue && cond.ObservedGeneration == c.generation
}
