// Command image builds student-controller's container image without a Docker engine
// and without pulling a base image: one layer holding the static binary, on an empty
// base, run as user 65532. The same binary and flags give the same image digest: every
// timestamp is the epoch (or SOURCE_DATE_EPOCH), the tar is written in a fixed order and
// the layer is compressed the same way each time.
//
//	image -binary bin/image/student-controller -out bin/image/oci -version v1.2.3 [-push REGISTRY/REPO:TAG]
//
// It writes an OCI image layout to -out, prints the image's digest (sha256:...), and
// with -push copies the image to a registry (credentials as docker and crane find them).
// -entrypoint, -user and -title make another one-binary image the same way (the local
// node's pause image).
//
//	image -layout bin/image/oci -push REGISTRY/REPO:TAG
//
// pushes the image of a layout written before, and prints its digest.
//
//	image -serve 127.0.0.1:5000
//
// serves a registry, in memory, until it is stopped: the local node's containerd pulls
// its images from it, as a cluster's nodes pull from theirs.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// image says what goes into an image besides its binary.
type image struct {
	// Entrypoint is where the binary lives in the image.
	Entrypoint string
	// User runs it.
	User   string
	Arch   string
	Labels map[string]string
}

func main() {
	binary := flag.String("binary", "", "The static student-controller binary to put in the image.")
	out := flag.String("out", "", "Folder to write the OCI image layout to (emptied first).")
	version := flag.String("version", "devel", "The version the image is labeled with.")
	source := flag.String("source", "https://github.com/student-controller/student-controller", "The source repository the image is labeled with.")
	revision := flag.String("revision", "", "The source revision the image is labeled with.")
	push := flag.String("push", "", "Also push the image to this reference, e.g. registry.example.com/student-controller:v1.2.3.")
	arch := flag.String("arch", "amd64", "The binary's architecture (GOARCH).")
	entrypoint := flag.String("entrypoint", "/student-controller", "Where the binary lives in the image.")
	// The nonroot user of distroless images, above the host's IDs.
	user := flag.String("user", "65532:65532", "The user the image runs as.")
	title := flag.String("title", "student-controller", "The image's title label.")
	serve := flag.String("serve", "", "Serve a registry, in memory, at this address instead (host:port).")
	fromLayout := flag.String("layout", "", "Push the image of this OCI layout (written by an earlier run) to -push instead of building one, "+
		"never over a tag that holds another image.")
	unpublished := flag.String("unpublished", "", "With -layout: refuse to push when this reference exists already (a release's chart).")
	binaries := flag.String("binaries", "", "Build one image for each ARCH=BINARY of this comma-separated list (e.g. amd64=bin/a,arm64=bin/b) "+
		"and write them as one multi-arch index (-binary and -arch are then unused).")
	flag.Parse()
	if *serve != "" {
		if err := serveRegistry(*serve); err != nil {
			fmt.Fprintln(os.Stderr, "image:", err)
			os.Exit(1)
		}
		return
	}
	if *fromLayout != "" {
		if err := pushLayout(*fromLayout, *push, *unpublished); err != nil {
			fmt.Fprintln(os.Stderr, "image:", err)
			os.Exit(1)
		}
		return
	}
	img := image{Entrypoint: *entrypoint, User: *user, Arch: *arch, Labels: map[string]string{
		"org.opencontainers.image.title":    *title,
		"org.opencontainers.image.version":  *version,
		"org.opencontainers.image.source":   *source,
		"org.opencontainers.image.revision": *revision,
		"org.opencontainers.image.licenses": "Apache-2.0",
	}}
	if *binaries != "" {
		if err := runIndex(*binaries, *out, *version, img); err != nil {
			fmt.Fprintln(os.Stderr, "image:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*binary, *out, *version, *push, img); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// serveRegistry serves go-containerregistry's registry at addr until the process is
// stopped. It logs each request, and says when it listens.
func serveRegistry(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "registry: serving on %s\n", l.Addr())
	srv := &http.Server{Handler: registry.New(), ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(l)
}

// pushLayout pushes the one image of the OCI layout at dir to the reference push and
// prints its digest. It pushes nothing when push holds another image already, or
// unpublished (if not empty) exists: a published version is never replaced.
func pushLayout(dir, push, unpublished string) error {
	if push == "" {
		return errors.New("-layout needs -push")
	}
	index, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return fmt.Errorf("read the OCI layout %s: %w", dir, err)
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		return err
	}
	if len(manifest.Manifests) != 1 {
		return fmt.Errorf("the OCI layout %s holds %d images, want 1", dir, len(manifest.Manifests))
	}
	if err := refuseReplacing(push, manifest.Manifests[0].Digest, unpublished); err != nil {
		return err
	}
	if manifest.Manifests[0].MediaType.IsIndex() {
		// A release's multi-arch index (-binaries): pushed whole, its images with it.
		idx, err := index.ImageIndex(manifest.Manifests[0].Digest)
		if err != nil {
			return err
		}
		return pushTo(idx, push)
	}
	img, err := index.Image(manifest.Manifests[0].Digest)
	if err != nil {
		return err
	}
	return pushTo(img, push)
}

// refuseReplacing fails when the tag push names holds an image other than digest, or
// when unpublished (if not empty) exists.
func refuseReplacing(push string, digest v1.Hash, unpublished string) error {
	ref, err := name.ParseReference(push)
	if err != nil {
		return fmt.Errorf("-push %q: %w", push, err)
	}
	if desc, err := head(ref); err != nil {
		return err
	} else if desc != nil && desc.Digest != digest {
		return fmt.Errorf("%s is published already, as %s: a published version is never replaced; release a new version", ref, desc.Digest)
	}
	if unpublished == "" {
		return nil
	}
	other, err := name.ParseReference(unpublished)
	if err != nil {
		return fmt.Errorf("-unpublished %q: %w", unpublished, err)
	}
	if desc, err := head(other); err != nil {
		return err
	} else if desc != nil {
		return fmt.Errorf("%s is published already, as %s: a published version is never replaced; release a new version", other, desc.Digest)
	}
	return nil
}

// head is the descriptor ref names in its registry, or nil when the registry has none.
func head(ref name.Reference) (*v1.Descriptor, error) {
	desc, err := remote.Head(ref, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", ref, err)
	}
	return desc, nil
}

// pushTo copies an image or an index (with its images) to the reference push, whole,
// and prints its digest.
func pushTo(t interface {
	remote.Taggable
	Digest() (v1.Hash, error)
}, push string) error {
	digest, err := t.Digest()
	if err != nil {
		return err
	}
	ref, err := name.ParseReference(push)
	if err != nil {
		return fmt.Errorf("-push %q: %w", push, err)
	}
	if err := remote.Push(ref, t, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("push to %s: %w", ref, err)
	}
	fmt.Fprintf(os.Stderr, "pushed %s@%s\n", ref.Context(), digest)
	fmt.Println(digest)
	return nil
}

func run(binary, out, version, push string, spec image) error {
	if binary == "" || out == "" {
		return errors.New("-binary and -out are required")
	}
	if !strings.HasPrefix(spec.Entrypoint, "/") || len(spec.Entrypoint) < 2 {
		return fmt.Errorf("-entrypoint %q: an absolute path", spec.Entrypoint)
	}
	created, err := buildTime()
	if err != nil {
		return err
	}
	img, err := build(binary, created, spec)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	if err := writeLayout(out, version, func(p layout.Path, o layout.Option) error { return p.AppendImage(img, o) }); err != nil {
		return err
	}
	if push != "" {
		return pushTo(img, push)
	}
	fmt.Println(digest)
	return nil
}

// runIndex builds an image for each ARCH=BINARY of list and writes them to out as one
// OCI image index, whose digest it prints: what a release publishes, reproducible as
// each image is.
func runIndex(list, out, version string, spec image) error {
	if out == "" {
		return errors.New("-out is required")
	}
	created, err := buildTime()
	if err != nil {
		return err
	}
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, pair := range strings.Split(list, ",") {
		arch, binary, ok := strings.Cut(pair, "=")
		if !ok || arch == "" || binary == "" {
			return fmt.Errorf("-binaries: %q is not ARCH=BINARY", pair)
		}
		archSpec := spec
		archSpec.Arch = arch
		img, err := build(binary, created, archSpec)
		if err != nil {
			return err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			MediaType: types.OCIManifestSchema1,
			Platform:  &v1.Platform{OS: "linux", Architecture: arch},
		}})
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	if err := writeLayout(out, version, func(p layout.Path, o layout.Option) error { return p.AppendIndex(idx, o) }); err != nil {
		return err
	}
	fmt.Println(digest)
	return nil
}

// writeLayout replaces the folder out with an OCI layout that holds what add appends
// (one image or one index), named version.
func writeLayout(out, version string, add func(layout.Path, layout.Option) error) error {
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	path, err := layout.Write(out, empty.Index)
	if err != nil {
		return fmt.Errorf("write the OCI layout: %w", err)
	}
	if err := add(path, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": version})); err != nil {
		return fmt.Errorf("write the OCI layout: %w", err)
	}
	return nil
}

// build makes the image: an OCI manifest and config, one layer.
func build(binary string, created time.Time, spec image) (v1.Image, error) {
	layerTar, err := layerOf(binary, spec.Entrypoint, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "hack/tools/image: " + spec.Entrypoint, Comment: "the static binary"},
		MediaType: types.OCILayer,
	})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", spec.Arch
	cfg.Created = v1.Time{Time: created}
	cfg.Config = v1.Config{
		User:       spec.User,
		Entrypoint: []string{spec.Entrypoint},
		WorkingDir: "/",
		Labels:     spec.Labels,
		Env:        []string{"PATH=/"},
	}
	return mutate.ConfigFile(img, cfg)
}

// layerOf is the tar of the one file, owned by root and readable and runnable by all,
// stamped with created.
func layerOf(binary, entrypoint string, created time.Time) ([]byte, error) {
	data, err := os.ReadFile(binary) // #nosec G304 -- the binary the Makefile built and names
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{
		Name:     entrypoint[1:],
		Mode:     0o755,
		Size:     int64(len(data)),
		ModTime:  created,
		Typeflag: tar.TypeReg,
		Format:   tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// buildTime is SOURCE_DATE_EPOCH when set (reproducible-builds.org), else the epoch.
func buildTime() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	sec, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", v, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}
