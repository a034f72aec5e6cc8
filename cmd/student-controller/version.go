package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version and commit are stamped at build time: -ldflags "-X main.version=1.2.3
// -X main.commit=HASH" (make release, which builds without VCS stamps).
var version, commit = "devel", ""

func versionString() string {
	if info, ok := debug.ReadBuildInfo(); ok && commit == "" {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				commit = s.Value
			}
		}
	}
	if commit != "" {
		return fmt.Sprintf("student-controller %s (%s, commit %s)", version, runtime.Version(), commit)
	}
	return fmt.Sprintf("student-controller %s (%s)", version, runtime.Version())
}
