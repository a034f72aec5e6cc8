package main

import "testing"

func TestParseMachineCPU(t *testing.T) {
	got, err := parseMachineCPU("cpu  1582368 277 356809 4146774 26040 0 24000 38650 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	want := machineCPU{busy: (1582368 + 277 + 356809 + 0 + 24000) / 100.0, idle: (4146774 + 26040) / 100.0, steal: 386.5}
	if got != want {
		t.Errorf("parseMachineCPU = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8\n", "cpu 1 2 3 4 5 6 7\n", "cpu 1 2 3 x 5 6 7 8\n"} {
		if _, err := parseMachineCPU(bad); err == nil {
			t.Errorf("parseMachineCPU(%q) took it", bad)
		}
	}
}
