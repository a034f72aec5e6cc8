package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// recordFile is where the running node keeps what Stop puts back, so that when it is
// killed instead (a test binary past its timeout, kill -9 on make cluster) the next
// node on this machine, or `student-node clean-node`, puts it back: holding the machine's
// node lock shows that the node that wrote it is gone.
const recordFile = "/run/student-node.json"

// record is what a node changed on the machine outside its processes.
type record struct {
	// Dir is the node's folder; RemoveDir says New made it.
	Dir       string `json:"dir"`
	RemoveDir bool   `json:"removeDir,omitempty"`
	// Made are the folders outside Dir that were not there before the node.
	Made []string `json:"made,omitempty"`
	// Sysctls are their values before the node.
	Sysctls map[string]string `json:"sysctls"`
}

func (r *record) save() error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(recordFile, b, 0o600)
}

// putBack removes what the node of the record made and sets the sysctls back, and
// then the record.
func (r *record) putBack() error {
	errs := []error{clean(r.Dir, r.Made)}
	if r.Sysctls != nil {
		errs = append(errs, restoreSysctls(r.Sysctls))
	}
	if r.RemoveDir {
		errs = append(errs, os.RemoveAll(r.Dir))
	}
	if err := errors.Join(errs...); err != nil {
		return err // the record stays, for another try
	}
	if err := os.Remove(recordFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// recoverKilled puts back what the node of the record left, if there is a record, and
// says what was there. The caller holds the machine's node lock.
func recoverKilled() ([]string, error) {
	b, err := os.ReadFile(recordFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("the record %s of a node that was killed: %w", recordFile, err)
	}
	left := Leftovers(r.Dir)
	if err := r.putBack(); err != nil {
		return left, fmt.Errorf("remove what the node that was killed left (its record %s): %w", recordFile, err)
	}
	return append(left, "sysctls set back, record "+recordFile+" removed"), nil
}
