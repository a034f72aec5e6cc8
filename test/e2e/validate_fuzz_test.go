package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// FuzzValidateSpec is differential: StudentSpec.Validate, which the controller applies
// for the CRD's rules in Go, and the real API server must accept and refuse exactly the
// same specs. Each spec goes to the API server as a server-side dry-run create, as the
// JSON a client would send: its strings either encoded by encoding/json or, when raw is
// set and the text is one valid JSON string on its own, written as given (so that
// escapes such as a lone surrogate "\ud800" reach the server's decoder). Go decodes the
// same JSON strings to get the spec it validates.
func FuzzValidateSpec(f *testing.F) {
	long := func(s string, n int) string { return strings.Repeat(s, n) }
	for _, seed := range []struct {
		name, school, policy string
		raw                  bool
	}{
		{"张三", "深圳中学", "", false},
		{"张三", "深圳中学", "Orphan", false},
		{"张三", "深圳中学", "Delete", false},
		{"张三", "深圳中学", "orphan", false},
		{"张三", "深圳中学", "Keep", false},
		{"", "深圳中学", "", false},
		{"   ", "深圳中学", "", false},
		{"\t\n\v\f\r", "school", "", false},
		{"\u00a0", "school", "", false},       // no-break space
		{"\u0085", "school", "", false},       // next line
		{"\u2003\u3000", "school", "", false}, // em space, ideographic space
		{"\u200b", "school", "", false},       // zero-width space: not White_Space
		{"\ufeff", "school", "", false},       // byte-order mark
		{"\u180e", "school", "", false},       // Mongolian vowel separator, no longer a space
		{"e\u0301", "school", "", false},      // combining mark
		{"\x00", "school", "", false},
		{"a\x00b", "school", "", false}, // NUL inside: PostgreSQL cannot store it
		{"a", "sch\x00ool", "", false},
		{"a\nb", "school", "", false}, // C0 controls: refused
		{"a", "x\x1fy", "", false},
		{"a\u0080b", "school", "", false}, // C1: not [[:cntrl:]], taken by both
		{"a\x7fb", "school", "", false},
		{"\xff\xfe", "school", "", false}, // not UTF-8: encoding/json sends U+FFFD
		{`\ud800`, "school", "", true},    // a lone surrogate, escaped
		{`\udfff\ud800`, "school", "", true},
		{`\ud83d\ude00`, "school", "", true}, // a surrogate pair: 😀
		{`\u0000`, "school", "", true},
		{long("a", 128), long("b", 256), "", false},
		{long("a", 129), "b", "", false},
		{"a", long("b", 257), "", false},
		{long("学", 128), long("校", 256), "", false},
		{long("学", 129), "校", "", false},
		{long("😀", 128), "school", "", false},
		{long("😀", 129), "school", "", false},
		{long("e\u0301", 64), "school", "", false},
		{long("e\u0301", 65), "school", "", false},
		{" a ", " b ", "", false},
	} {
		f.Add(seed.name, seed.school, seed.policy, seed.raw)
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS = -1 // one request per input, as fast as the server answers
	client := versioned.NewForConfigOrDie(cfg).BolingcavalryV1().RESTClient()
	f.Fuzz(func(t *testing.T, name, school, policy string, raw bool) {
		var spec studentv1.StudentSpec
		nameJSON, ok1 := literal(name, raw, &spec.Name)
		schoolJSON, ok2 := literal(school, raw, &spec.School)
		if !ok1 || !ok2 {
			t.Skip("not one JSON string as written")
		}
		policyJSON := ""
		if policy != "" {
			lit, _ := json.Marshal(policy)
			_ = json.Unmarshal(lit, &spec.DeletionPolicy)
			policyJSON = `,"deletionPolicy":` + string(lit)
		}
		body := fmt.Sprintf(`{"apiVersion":"bolingcavalry.k8s.io/v1","kind":"Student","metadata":{"name":"fuzz"},"spec":{"name":%s,"school":%s%s}}`,
			nameJSON, schoolJSON, policyJSON)

		// The fuzzing engine kills a worker whose call takes 10 s, without a word about
		// the input; a request that hangs fails here first, and names it.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		err := client.Post().Namespace("default").Resource("students").Param("dryRun", "All").
			SetHeader("Content-Type", "application/json").Body([]byte(body)).Do(ctx).Error()
		if ctx.Err() != nil {
			t.Fatalf("the API server did not answer a dry-run create within %v (%v): %s", time.Since(start).Round(time.Millisecond), err, body)
		}
		problem := spec.Validate()
		switch {
		case err == nil && problem != "":
			t.Errorf("the API server accepts %s; Validate refuses it: %s", body, problem)
		case apierrors.IsInvalid(err) && problem == "":
			t.Errorf("the API server refuses %s (%v); Validate accepts it", body, err)
		case err != nil && !apierrors.IsInvalid(err):
			t.Errorf("the API server answers %s with %v, neither accepted nor refused as invalid", body, err)
		}
	})
}

// literal returns s as a JSON string literal, and decodes that literal into out as the
// API server's decoder would: encoded by encoding/json, or when raw, written as given
// if it is one valid JSON string on its own.
func literal(s string, raw bool, out *string) (string, bool) {
	lit := `"` + s + `"`
	if !raw {
		b, err := json.Marshal(s)
		if err != nil {
			return "", false
		}
		lit = string(b)
	}
	if err := json.Unmarshal([]byte(lit), out); err != nil {
		return "", false
	}
	return lit, true
}
