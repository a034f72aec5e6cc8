package main

import (
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestPush: -push puts the image the layout holds into a registry (go-containerregistry's
// own, in memory), under the reference given, with the same digest.
func TestPush(t *testing.T) {
	server := httptest.NewServer(registry.New())
	defer server.Close()
	host := mustHost(t, server.URL)

	dir := t.TempDir()
	binary := filepath.Join(dir, "student-controller")
	if err := os.WriteFile(binary, []byte("#!not really a binary\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "oci")
	ref := host + "/student-controller:v0.0.1"
	spec := image{Entrypoint: "/student-controller", User: "65532:65532", Arch: "amd64", Labels: map[string]string{"org.opencontainers.image.revision": "abc123"}}
	if err := run(binary, out, "v0.0.1", ref, spec); err != nil {
		t.Fatal(err)
	}

	index, err := layout.ImageIndexFromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := index.IndexManifest()
	if err != nil || len(manifest.Manifests) != 1 {
		t.Fatalf("layout index: %v, %v", manifest, err)
	}
	parsed, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Image(parsed)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	digest, err := pulled.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if digest != manifest.Manifests[0].Digest {
		t.Errorf("pushed %s, the layout holds %s", digest, manifest.Manifests[0].Digest)
	}

	// -layout pushes the image of the layout as it is: the same digest.
	copyRef := host + "/copy:v0.0.1"
	if err := pushLayout(out, copyRef); err != nil {
		t.Fatal(err)
	}
	parsed, err = name.ParseReference(copyRef)
	if err != nil {
		t.Fatal(err)
	}
	copied, err := remote.Image(parsed)
	if err != nil {
		t.Fatalf("pull %s: %v", copyRef, err)
	}
	if d, err := copied.Digest(); err != nil || d != digest {
		t.Errorf("-layout pushed %s (%v), want %s", d, err, digest)
	}
}

func mustHost(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}
