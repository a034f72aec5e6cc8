package main

import "testing"

func TestCheckHistory(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		rows, n                   int
		withoutHistory, converged bool
		wantErr                   bool
	}{
		{"with the history, converged", 10000, 10000, false, true, false},
		{"with the history, converged, rows missing", 9000, 10000, false, true, true},
		{"with the history, cut off before converging", 913, 10000, false, false, false},
		{"without the history", 0, 10000, true, true, false},
		{"without the history, but rows written", 10, 10000, true, true, true},
		{"without the history, cut off, but rows written", 10, 10000, true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkHistory(tc.rows, tc.n, tc.withoutHistory, tc.converged)
			if (err != nil) != tc.wantErr {
				t.Fatalf("checkHistory(%d, %d, %v, %v) = %v, want an error %v", tc.rows, tc.n, tc.withoutHistory, tc.converged, err, tc.wantErr)
			}
		})
	}
}
