package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
)

// TestImage: `make image` builds the same image twice (same digest); the image runs as
// 65532 with the binary as entry point and nothing else in it (no shell); and the
// binary taken out of it runs the controller against the local control plane.
func TestImage(t *testing.T) {
	t.Parallel()
	var digests []string
	var layouts []string
	for range 2 {
		dir := t.TempDir()
		cmd := exec.Command("make", "--no-print-directory", "image", "IMAGE_DIR="+dir)
		cmd.Dir = env.Root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("make image: %v\n%s%s", err, out, stderr.String())
		}
		digest := strings.TrimSpace(string(out))
		if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(digest) {
			t.Fatalf("make image printed %q, want the digest as sha256:...", out)
		}
		digests = append(digests, digest)
		layouts = append(layouts, filepath.Join(dir, "oci"))
	}
	if digests[0] != digests[1] {
		t.Errorf("two builds of one tree gave two digests: %v", digests)
	}

	img := readLayout(t, layouts[0])
	if img.manifestDigest != digests[0] {
		t.Errorf("the layout's manifest is %s, make image printed %s", img.manifestDigest, digests[0])
	}
	cfg := img.config.Config
	if cfg.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", cfg.User)
	}
	if len(cfg.Entrypoint) != 1 || cfg.Entrypoint[0] != "/student-controller" {
		t.Errorf("entry point %q, want [/student-controller]", cfg.Entrypoint)
	}
	for _, label := range []string{"org.opencontainers.image.version", "org.opencontainers.image.source", "org.opencontainers.image.revision"} {
		if cfg.Labels[label] == "" {
			t.Errorf("label %s missing: %v", label, cfg.Labels)
		}
	}
	if img.config.OS != "linux" || img.config.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64", img.config.OS, img.config.Architecture)
	}
	if want := []string{"student-controller"}; strings.Join(img.files, ",") != strings.Join(want, ",") {
		t.Errorf("the image holds %v, want only %v (no shell, no base)", img.files, want)
	}

	// The binary out of the image, run as the controller's ServiceAccount.
	bin := filepath.Join(t.TempDir(), "student-controller")
	if err := os.WriteFile(bin, img.binary, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "--version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "student-controller ") {
		t.Errorf("--version of the image's binary: %q, %v", out, err)
	}
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	path := filepath.Join(t.TempDir(), "registry.db")
	startBinary(t, "image-binary", bin, nil, "--kubeconfig", controllerID.Kubeconfig, "--namespace", ns,
		"--registry", "sqlite://"+path, "--registry-owner", owner)
	if _, err := students(ns).Create(context.Background(), newStudent("from-the-image", "深圳中学", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	assertRowsMatch(t, registrytest.OpenSQLite(t, path), waitAllReady(t, ns, 1, time.Minute))
}

// ociImage is what TestImage reads of an OCI image layout.
type ociImage struct {
	manifestDigest string
	config         struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Config       struct {
			User       string            `json:"User"`
			Entrypoint []string          `json:"Entrypoint"`
			Labels     map[string]string `json:"Labels"`
		} `json:"config"`
	}
	files  []string
	binary []byte
}

// readLayout reads the one image of an OCI layout with the standard library alone:
// index, manifest, config, and the files of its layers.
func readLayout(t *testing.T, dir string) ociImage {
	t.Helper()
	blob := func(digest string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, "blobs", strings.Replace(digest, ":", "/", 1)))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	type descriptor struct {
		Digest string `json:"digest"`
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v, %d manifests, want 1", err, len(index.Manifests))
	}
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	img := ociImage{manifestDigest: index.Manifests[0].Digest}
	if err := json.Unmarshal(blob(img.manifestDigest), &manifest); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(blob(manifest.Config.Digest), &img.config); err != nil {
		t.Fatal(err)
	}
	for _, layer := range manifest.Layers {
		zr, err := gzip.NewReader(bytes.NewReader(blob(layer.Digest)))
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(zr)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			img.files = append(img.files, hdr.Name)
			if hdr.Name == "student-controller" {
				if img.binary, err = io.ReadAll(tr); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return img
}
