//go:build !race

package chaos

// The suite runs without the race detector (make test) and builds its controllers
// without it: make chaos looks for data races.
const (
	raceDetector = false
	invLogs      = "no panic in the controller's log (built without the race detector)"
)
