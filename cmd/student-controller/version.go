package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is stamped at build time: -ldflags "-X main.version=v1.2.3".
var version = "devel"

func versionString() string {
	commit := ""
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				commit = ", commit " + s.Value
			}
		}
	}
	return fmt.Sprintf("student-controller %s (%s%s)", version, runtime.Version(), commit)
}
