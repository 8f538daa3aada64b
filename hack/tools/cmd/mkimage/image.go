package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// newImage wraps the uncompressed layer into an OCI image with the configured
// entrypoint, command, environment and platform.
func newImage(layer []byte, cfg config) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, static.NewLayer(layer, types.OCIUncompressedLayer))
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = cfg.arch
	cf.Config.Entrypoint = cfg.entrypoint
	cf.Config.Cmd = cfg.cmd
	cf.Config.WorkingDir = cfg.workdir
	cf.Config.Env = []string{defaultPath}
	for _, e := range cfg.env {
		cf.Config.Env = append(cf.Config.Env, e)
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}

// writeImage writes img to out atomically: a temporary file in the same
// directory, fsync, rename.
func writeImage(out, ref, format string, img v1.Image) error {
	tag, err := name.NewTag(ref, name.WithDefaultRegistry("docker.io"))
	if err != nil {
		return fmt.Errorf("parse reference %q: %w", ref, err)
	}
	f, err := os.CreateTemp(filepath.Dir(out), ".mkimage-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()

	if format == "docker" {
		err = tarball.Write(tag, img, f)
	} else {
		err = writeOCILayout(f, tag, img)
	}
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), out)
}

// writeOCILayout writes an OCI image layout (oci-layout, index.json, blobs/) as a
// tar stream. The index entry carries the name annotations that containerd's
// importer uses to create the image record.
func writeOCILayout(w *os.File, tag name.Tag, img v1.Image) error {
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	configName, err := img.ConfigName()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}

	index := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: types.OCIManifestSchema1,
			Digest:    digest,
			Size:      int64(len(manifest)),
			Annotations: map[string]string{
				"io.containerd.image.name":          tag.Name(),
				"org.opencontainers.image.ref.name": tag.TagStr(),
			},
		}},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		_, err = buf.ReadFrom(rc)
		rc.Close()
		if err != nil {
			return err
		}
		if err := add(blob(d), buf.Bytes()); err != nil {
			return err
		}
	}
	if err := add(blob(configName), config); err != nil {
		return err
	}
	if err := add(blob(digest), manifest); err != nil {
		return err
	}
	if err := add("index.json", indexJSON); err != nil {
		return err
	}
	return tw.Close()
}
