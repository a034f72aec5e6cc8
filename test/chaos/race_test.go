//go:build race

package chaos

// The suite runs under the race detector (make chaos) and builds its controllers with
// it, so their logs show any data race.
const (
	raceDetector = true
	invLogs      = "no panic or data race in the controller's log"
)
