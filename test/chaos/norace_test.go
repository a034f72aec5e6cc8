//go:build !chaosrace

package chaos

// raceControllers: the suite builds its controllers as they ship, without the race
// detector (make test).
const raceControllers = false
