//go:build chaosrace

package chaos

// raceControllers: the suite builds its controllers with the race detector (make
// chaos, -tags chaosrace).
const raceControllers = true
