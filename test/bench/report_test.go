package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestScaleTargetsSayTheMiss renders the committed scale run against the committed
// N = 10000 run, as -render does, with student-controller's memory growth set one point
// over its share of the peer's, and reads what it says of the miss.
func TestScaleTargetsSayTheMiss(t *testing.T) {
	b, err := os.ReadFile("../../bench/results/n100000.json")
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	from, err := base("../../bench/results", rep.N)
	if err != nil || from == nil {
		t.Fatalf("the N = %d results: %v", targetN, err)
	}
	now := byName(rep)
	was := byName(*from)
	sc, peer := "student-controller", "controller-runtime"
	if now[sc] == nil || now[peer] == nil || was[sc] == nil || was[peer] == nil {
		t.Fatalf("the runs lack %s or %s", sc, peer)
	}
	// Growth one percentage point over the share of the peer's growth the target allows,
	// whatever the committed run measured.
	theirs := now[peer].SteadyRSSMiB - was[peer].SteadyRSSMiB
	now[sc].SteadyRSSMiB = was[sc].SteadyRSSMiB + (growthShareOfPeer+0.01)*theirs
	text := scaleTargets(rep, from)
	if strings.Contains(text, " points over") {
		t.Errorf("the miss reads as a count of points, which reads wrong for one:\n%s", text)
	}
	if want := "the target is 15%"; !strings.Contains(text, want) {
		t.Errorf("the miss does not name the target (%q):\n%s", want, text)
	}
}
