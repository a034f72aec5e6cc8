package testenv

import (
	"fmt"
	"os"
	"os/exec"
)

// The previous release, where the upgrade tests start from: the last commit of
// version 0.3.0, its version and its registry schema.
const (
	PreviousRelease = "9fb0238b332e5ab0d2878a6c67022f7f0cd261ab"
	PreviousVersion = "0.3.0"
	PreviousSchema  = 7
)

// Archive writes the tree of commit of the repository at root into dir (paths of it
// only, when given), as git archive does.
func Archive(root, commit, dir string, paths ...string) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	args := append([]string{"-c", `git -c safe.directory="$1" -C "$1" archive --format=tar "$2" "${@:4}" | tar -x -C "$3"`, "archive", root, commit, dir}, paths...)
	if out, err := exec.Command("bash", args...).CombinedOutput(); err != nil { // #nosec G204 -- git of this repository
		return fmt.Errorf("the tree of commit %s (a clone without the history lacks it: git fetch --unshallow): %v\n%s", commit, err, out)
	}
	return nil
}
