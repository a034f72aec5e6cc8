package main

import (
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
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
	if err := pushLayout(out, copyRef, ""); err != nil {
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

// TestIndexReproducible: -binaries writes one index of an image per architecture, each
// with its platform, and two runs over the same binaries give the same index digest.
func TestIndexReproducible(t *testing.T) {
	dir := t.TempDir()
	var list []string
	for _, arch := range []string{"amd64", "arm64"} {
		binary := filepath.Join(dir, arch)
		if err := os.WriteFile(binary, []byte("#!not really a binary for "+arch+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		list = append(list, arch+"="+binary)
	}
	spec := image{Entrypoint: "/student-controller", User: "65532:65532", Labels: map[string]string{"org.opencontainers.image.version": "0.0.1"}}
	digests := map[string]bool{}
	for _, out := range []string{filepath.Join(dir, "one"), filepath.Join(dir, "two")} {
		if err := runIndex(strings.Join(list, ","), out, "0.0.1", spec); err != nil {
			t.Fatal(err)
		}
		root, err := layout.ImageIndexFromPath(out)
		if err != nil {
			t.Fatal(err)
		}
		top, err := root.IndexManifest()
		if err != nil || len(top.Manifests) != 1 {
			t.Fatalf("the layout's index: %v, %v; want the one image index", top, err)
		}
		digests[top.Manifests[0].Digest.String()] = true
		idx, err := root.ImageIndex(top.Manifests[0].Digest)
		if err != nil {
			t.Fatal(err)
		}
		m, err := idx.IndexManifest()
		if err != nil || len(m.Manifests) != 2 || m.Manifests[0].Platform.Architecture != "amd64" || m.Manifests[1].Platform.Architecture != "arm64" {
			t.Fatalf("the release index: %+v, %v; want amd64 and arm64", m, err)
		}
		img, err := idx.Image(m.Manifests[1].Digest)
		if err != nil {
			t.Fatal(err)
		}
		if cfg, err := img.ConfigFile(); err != nil || cfg.Architecture != "arm64" {
			t.Errorf("the arm64 image's config: %+v, %v", cfg, err)
		}
	}
	if len(digests) != 1 {
		t.Errorf("two runs gave index digests %v, want one", digests)
	}
}

// TestPushIndex: -layout with an index layout (-binaries) pushes the index whole: the
// registry serves it by its tag with both platforms, under the same digest.
func TestPushIndex(t *testing.T) {
	server := httptest.NewServer(registry.New())
	defer server.Close()
	dir := t.TempDir()
	var list []string
	for _, arch := range []string{"amd64", "arm64"} {
		binary := filepath.Join(dir, arch)
		if err := os.WriteFile(binary, []byte("#!"+arch+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		list = append(list, arch+"="+binary)
	}
	out := filepath.Join(dir, "oci")
	if err := runIndex(strings.Join(list, ","), out, "0.0.1", image{Entrypoint: "/student-controller", User: "65532:65532"}); err != nil {
		t.Fatal(err)
	}
	ref := mustHost(t, server.URL) + "/student-controller:0.0.1"
	if err := pushLayout(out, ref, mustHost(t, server.URL)+"/charts/student-controller:0.0.1"); err != nil {
		t.Fatal(err)
	}
	parsed, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Index(parsed)
	if err != nil {
		t.Fatalf("pull the index %s: %v", ref, err)
	}
	m, err := pulled.IndexManifest()
	if err != nil || len(m.Manifests) != 2 {
		t.Fatalf("the pushed index: %+v, %v; want two images", m, err)
	}
	root, err := layout.ImageIndexFromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	top, err := root.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := pulled.Digest(); got != top.Manifests[0].Digest {
		t.Errorf("pushed %s, the layout holds %s", got, top.Manifests[0].Digest)
	}
}

// TestPushNeverReplaces: -layout pushes the same index to its tag again (a publish cut
// short runs again), but not another over it, nor anything once -unpublished exists.
func TestPushNeverReplaces(t *testing.T) {
	server := httptest.NewServer(registry.New())
	defer server.Close()
	host := mustHost(t, server.URL)
	dir := t.TempDir()
	layouts := map[string]string{}
	for _, build := range []string{"one", "two"} {
		binary := filepath.Join(dir, build)
		if err := os.WriteFile(binary, []byte("#!"+build+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		layouts[build] = filepath.Join(dir, build+".oci")
		if err := runIndex("amd64="+binary, layouts[build], "0.0.1", image{Entrypoint: "/student-controller", User: "65532:65532"}); err != nil {
			t.Fatal(err)
		}
	}
	ref, chart := host+"/student-controller:0.0.1", host+"/charts/student-controller:0.0.1"
	if err := pushLayout(layouts["one"], ref, chart); err != nil {
		t.Fatal(err)
	}
	if err := pushLayout(layouts["one"], ref, chart); err != nil {
		t.Errorf("the same index again: %v, want it pushed", err)
	}
	err := pushLayout(layouts["two"], ref, chart)
	if err == nil || !strings.Contains(err.Error(), "published already") {
		t.Errorf("another index over the tag: %v, want it refused as published already", err)
	}
	// The chart's version is there (any image stands for it): nothing more is pushed.
	if err := pushLayout(layouts["one"], chart, ""); err != nil {
		t.Fatal(err)
	}
	err = pushLayout(layouts["one"], ref, chart)
	if err == nil || !strings.Contains(err.Error(), chart+" is published already") {
		t.Errorf("with the chart's version published: %v, want it refused", err)
	}
}
