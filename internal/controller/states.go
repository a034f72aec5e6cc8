package controller

import (
	"sync"
	"time"
	"unique"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// states are what the controller knows of its Students between syncs, which the
// metrics read: those not Ready after their last sync, those drifted, those paused
// (since when), and the clocks of the sync latency. Only what is out of line is
// kept, so that they cost nothing while all is well.
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

// synced records whether the Student of key is Ready after its sync and, when known,
// drifted. A drifted Student counts as drifted, not as not Ready: drift is what
// observing reports, not a fault.
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

// paused records that the Student of key is paused, since then; unpaused that it is
// not (or gone).
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

// forget drops a Student that is gone or being deleted from the not-Ready and
// drifted ones and the clocks of the sync latency, and one that is gone from the
// paused ones.
func (s *states) forget(key string) {
	s.synced(key, true, new(false))
	s.unpaused(key)
	s.generations.forget(key)
}

// counts are how many Students are not Ready, drifted and paused, and since when the
// one paused longest.
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

// newGenerations times each Student's new generation from the watch event that
// brings it to the sync that reports it Ready: the wait a user sees
// (student_controller_sync_latency_seconds). Each generation has its own clock; a
// newer generation that arrives first replaces it, unobserved. Only generations not
// yet reported Ready are kept, so it holds nothing while all is in line; its map is
// made anew once empty, since a Go map never shrinks and a burst of new Students would
// keep it at the burst's size.
type newGenerations struct {
	mu sync.Mutex
	at map[string]seenGeneration
}

type seenGeneration struct {
	generation int64
	at         time.Time
}

// seen records what a watch event shows of the Student of key. A generation not yet
// Ready starts its clock, unless that generation's runs already; one Ready (reported
// by this controller, or by the leader while this replica stands by) stops it
// unobserved. Students that are paused or being deleted are not timed: nothing is
// promised for them.
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

// reported stops the clock of key once a sync has reported generation Ready, and says
// how long it ran; false when no clock of that generation or an older one ran.
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

// forget stops the clock of a Student that is gone.
func (g *newGenerations) forget(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.at[key]; ok {
		g.drop(key)
	}
}

func (g *newGenerations) drop(key string) {
	delete(g.at, key)
	if len(g.at) == 0 {
		g.at = nil
	}
}

// isReady says whether the Student's status reports it Ready at its generation.
func (c *cachedStudent) isReady() bool {
	conds := c.rareField().conditions
	if c.conditions != (unique.Handle[conditionSet]{}) {
		set := c.conditions.Value()
		conds = set.c[:set.n]
	}
	cond := meta.FindStatusCondition(conds, studentv1.ConditionReady)
	return cond != nil && cond.Status == metav1.ConditionTrue && cond.ObservedGeneration == c.generation
}
