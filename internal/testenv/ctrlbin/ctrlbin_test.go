package ctrlbin

import "testing"

func TestWithTagsOf(t *testing.T) {
	for _, c := range []struct{ goflags, tags, want string }{
		{"", "bench_nohistory", "bench_nohistory"},
		{"-tags=grpcnotrace", "bench_nohistory", "grpcnotrace,bench_nohistory"},
		{"-modcacherw --tags=a,b", "c", "a,b,c"},
		{"-mod=mod -tags=", "c", "c"},
	} {
		if got := withTagsOf(c.goflags, c.tags); got != c.want {
			t.Errorf("withTagsOf(%q, %q) = %q, want %q", c.goflags, c.tags, got, c.want)
		}
	}
}
