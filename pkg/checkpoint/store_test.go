package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra-driver/internal/testfs"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// rawJSONEqual compares json.RawMessage values by meaning: Save indents the
// whole document, so the bytes of an embedded raw message change.
var rawJSONEqual = cmp.Comparer(func(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return false
	}
	return ca.String() == cb.String()
})

func fullCheckpoint() *Checkpoint {
	c := New()
	c.Put(&PreparedClaim{
		UID:       "uid-b",
		Namespace: "ml",
		Name:      "train",
		State:     PrepareCompleted,
		Devices: []PreparedDevice{
			{
				Request:      "gpus",
				Pool:         "node-a",
				Device:       "gpu-0",
				Kind:         vocabulary.KindGPU,
				UUIDs:        []string{"GPU-0000"},
				CDIDeviceIDs: []string{"k8s.gpu.dra.dev/gpu=uid-b-gpu-0"},
				ShareID:      "share-1",
				Sharing: &Sharing{
					Strategy: "MPS",
					Config:   json.RawMessage(`{"pipeDir":"/run/mps/x","activeThreadPercentage":50}`),
				},
			},
			{
				Request:      "mig",
				Pool:         "node-a",
				Device:       "gpu-1-mig-1g10gb-6",
				Kind:         vocabulary.KindMIG,
				UUIDs:        []string{"MIG-1111"},
				CDIDeviceIDs: []string{"k8s.gpu.dra.dev/gpu=uid-b-gpu-1-mig-1g10gb-6"},
				MIG: &MigInstance{
					ParentUUID:      "GPU-1111",
					GIProfileID:     19,
					Placement:       MigPlacement{Start: 6, Size: 1},
					GIID:            13,
					CIID:            0,
					CreatedByDriver: true,
				},
			},
		},
	})
	c.Put(&PreparedClaim{UID: "uid-a", Namespace: "default", Name: "pending", State: PrepareStarted})
	return c
}

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	for name, want := range map[string]*Checkpoint{
		"empty": New(),
		"full":  fullCheckpoint(),
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "checkpoint.json")
			store := NewFileStore(path)
			if err := store.Save(ctx, want); err != nil {
				t.Fatalf("Save: %v", err)
			}
			got, err := store.Load(ctx)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if diff := cmp.Diff(want, got, rawJSONEqual); diff != "" {
				t.Errorf("loaded checkpoint differs (-saved +loaded):\n%s", diff)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != fileMode {
				t.Errorf("file mode = %v, want %v", fi.Mode().Perm(), os.FileMode(fileMode))
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	got, err := NewFileStore(filepath.Join(t.TempDir(), "checkpoint.json")).Load(context.Background())
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got.Len() != 0 {
		t.Errorf("Load of a missing file returned %d claims, want none", got.Len())
	}
}

// TestLoadOtherReleases reads files written by other releases within format
// major version 1: an older one that lacks fields added since, and a newer one
// that has fields (top level, data, claims, devices) this release does not
// know.
func TestLoadOtherReleases(t *testing.T) {
	tests := map[string]*Checkpoint{
		"testdata/v1-previous.json": {Claims: map[types.UID]*PreparedClaim{
			"0b7d9c1e-5f0a-4a57-9d0e-3c8f1f6b2a10": {
				UID:       "0b7d9c1e-5f0a-4a57-9d0e-3c8f1f6b2a10",
				Namespace: "ml",
				Name:      "train-gpus",
				State:     PrepareCompleted,
				Devices: []PreparedDevice{{
					Request:      "gpu",
					Pool:         "node-a",
					Device:       "gpu-0",
					Kind:         vocabulary.KindGPU,
					UUIDs:        []string{"GPU-6f5b1a2e-0c3d-4e8f-9a7b-1d2c3e4f5a6b"},
					CDIDeviceIDs: []string{"k8s.gpu.dra.dev/gpu=0b7d9c1e-5f0a-4a57-9d0e-3c8f1f6b2a10-gpu-0"},
				}},
			},
			"9a1c2b3d-4e5f-4a6b-8c7d-0e1f2a3b4c5d": {
				UID:       "9a1c2b3d-4e5f-4a6b-8c7d-0e1f2a3b4c5d",
				Namespace: "default",
				Name:      "pending",
				State:     PrepareStarted,
			},
		}},
		"testdata/v1-next.json": {Claims: map[types.UID]*PreparedClaim{
			"0b7d9c1e-5f0a-4a57-9d0e-3c8f1f6b2a10": {
				UID:       "0b7d9c1e-5f0a-4a57-9d0e-3c8f1f6b2a10",
				Namespace: "ml",
				Name:      "train-gpus",
				State:     PrepareCompleted,
				Devices: []PreparedDevice{{
					Request:      "mig",
					Pool:         "node-a",
					Device:       "gpu-1-mig-1g10gb-0",
					Kind:         vocabulary.KindMIG,
					UUIDs:        []string{"MIG-1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"},
					CDIDeviceIDs: []string{"k8s.gpu.dra.dev/gpu=0b7d9c1e-5f0a-4a57-9d0e-3c8f1f6b2a10-gpu-1-mig-1g10gb-0"},
					MIG: &MigInstance{
						ParentUUID:      "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
						GIProfileID:     19,
						Placement:       MigPlacement{Start: 6, Size: 1},
						GIID:            13,
						CIID:            0,
						CreatedByDriver: true,
						Unknown:         Unknown{"ciProfileID": json.RawMessage(`0`)},
					},
					Unknown: Unknown{"health": json.RawMessage(`{"state":"Healthy"}`), "futureList": json.RawMessage(`[1,2,3]`)},
				}},
				Unknown: Unknown{"preparedAt": json.RawMessage(`"2026-11-30T06:00:00Z"`)},
			},
		}, Unknown: Unknown{"nodeName": json.RawMessage(`"node-a"`)}},
	}
	for fixture, want := range tests {
		t.Run(fixture, func(t *testing.T) {
			path := copyToTemp(t, fixture)
			store := NewFileStore(path)
			got, err := store.Load(context.Background())
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if diff := cmp.Diff(want, got, rawJSONEqual); diff != "" {
				t.Errorf("loaded checkpoint differs (-want +got):\n%s", diff)
			}
			// What this release writes back is readable again, with the
			// fields it does not know: a newer release may need them.
			if err := store.Save(context.Background(), got); err != nil {
				t.Fatalf("Save: %v", err)
			}
			again, err := store.Load(context.Background())
			if err != nil {
				t.Fatalf("Load after Save: %v", err)
			}
			if diff := cmp.Diff(want, again, rawJSONEqual); diff != "" {
				t.Errorf("checkpoint saved by this release lost something (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadCorrupt(t *testing.T) {
	valid, err := encode(fullCheckpoint())
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		content    []byte
		wantReason string
	}{
		"empty file": {
			content:    nil,
			wantReason: "empty",
		},
		"truncated": {
			content:    valid[:len(valid)/2],
			wantReason: "truncated or garbled",
		},
		"garbled": {
			content:    []byte("\x00\x17not json at all"),
			wantReason: "truncated or garbled",
		},
		"checksum mismatch": {
			// Same length, one claim name changed, checksum left alone.
			content:    bytes.Replace(valid, []byte(`"train"`), []byte(`"trair"`), 1),
			wantReason: "checksum mismatch",
		},
		"checksum missing": {
			content:    []byte(`{"version":"v1","data":{"claims":{}}}`),
			wantReason: "checksum",
		},
		"data missing": {
			content:    []byte(`{"version":"v1","checksum":"sha256:00"}`),
			wantReason: `"data" is missing`,
		},
		"version missing": {
			content:    []byte(`{"checksum":"sha256:00","data":{}}`),
			wantReason: `"version" is missing`,
		},
		"version garbled": {
			content:    []byte(`{"version":"one","checksum":"sha256:00","data":{}}`),
			wantReason: "invalid format version",
		},
		"claim under the wrong key": {
			content:    withData(`{"claims":{"a":{"uid":"b","state":"PrepareStarted"}}}`),
			wantReason: "has UID",
		},
		"data of the wrong type": {
			content:    withData(`{"claims":[1,2]}`),
			wantReason: "does not hold a checkpoint",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "checkpoint.json")
			if err := os.WriteFile(path, tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := NewFileStore(path).Load(context.Background())
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Load error = %v, want one matching ErrCorrupt", err)
			}
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Path != path {
				t.Errorf("error %v does not carry the path %s", err, path)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.wantReason) {
				t.Errorf("error %q does not name the file and %q", err, tc.wantReason)
			}
			if errors.Is(err, ErrUnsupportedVersion) {
				t.Errorf("corrupt file reported as unsupported version: %v", err)
			}
		})
	}
}

func TestLoadUnsupportedVersion(t *testing.T) {
	for _, version := range []string{"v2", "v2.1", "v10", "v0"} {
		t.Run(version, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "checkpoint.json")
			data := `{"claims":{},"newLayout":true}`
			content := fmt.Sprintf(`{"version":%q,"checksum":%q,"data":%s}`, version, checksum([]byte(data)), data)
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := NewFileStore(path).Load(context.Background())
			if !errors.Is(err, ErrUnsupportedVersion) {
				t.Fatalf("Load error = %v, want one matching ErrUnsupportedVersion", err)
			}
			if errors.Is(err, ErrCorrupt) {
				t.Errorf("unsupported version reported as corrupt: %v", err)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), version) {
				t.Errorf("error %q does not name the file and the version", err)
			}
		})
	}
}

// TestSaveNeverLeavesPartialFile saves concurrently while reading the file
// back: every read must decode, and no temporary file may remain.
func TestSaveNeverLeavesPartialFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	store := NewFileStore(path)
	if err := store.Save(ctx, New()); err != nil {
		t.Fatal(err)
	}

	const writers, saves = 4, 25
	var wg sync.WaitGroup
	done := make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		defer close(readErr)
		for {
			select {
			case <-done:
				return
			default:
			}
			content, err := os.ReadFile(path)
			if err == nil {
				_, err = decode(path, content)
			}
			if err != nil {
				readErr <- err
				return
			}
		}
	}()
	for w := range writers {
		wg.Go(func() {
			for i := range saves {
				c := fullCheckpoint()
				// Vary the size so a torn write would show.
				c.Put(&PreparedClaim{
					UID:   types.UID(fmt.Sprintf("uid-%d-%d", w, i)),
					Name:  strings.Repeat("x", (w*saves+i)%97),
					State: PrepareStarted,
				})
				if err := store.Save(ctx, c); err != nil {
					t.Errorf("Save: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(done)
	if err := <-readErr; err != nil {
		t.Fatalf("read a partial checkpoint during Save: %v", err)
	}
	testfs.AssertEntries(t, dir, "checkpoint.json")
}

func TestSaveFailureKeepsPreviousFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	store := NewFileStore(path)
	if err := store.Save(ctx, fullCheckpoint()); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	bad := fullCheckpoint()
	bad.Put(&PreparedClaim{UID: "bad", Devices: []PreparedDevice{{
		Sharing: &Sharing{Strategy: "MPS", Config: json.RawMessage(`{not json`)},
	}}})
	if err := store.Save(ctx, bad); err == nil {
		t.Fatal("Save of an unencodable checkpoint succeeded")
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Error("failed Save changed the checkpoint file")
	}
	testfs.AssertEntries(t, dir, "checkpoint.json")
}

func TestLoadRemovesLeftoverTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	if err := os.WriteFile(filepath.Join(dir, ".checkpoint.json.tmp-4711"), []byte(`{"vers`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewFileStore(path).Load(context.Background()); err != nil {
		t.Fatalf("Load: %v", err)
	}
	testfs.AssertEntries(t, dir)
}

func TestCanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	store := NewFileStore(filepath.Join(t.TempDir(), "checkpoint.json"))
	if _, err := store.Load(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Load error = %v, want context.Canceled", err)
	}
	if err := store.Save(ctx, New()); !errors.Is(err, context.Canceled) {
		t.Errorf("Save error = %v, want context.Canceled", err)
	}
}

func TestQuarantine(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	store := NewFileStore(path)
	now := time.Date(2026, 11, 30, 6, 15, 32, 0, time.FixedZone("CET", 3600))

	for i, wantName := range []string{
		"checkpoint.json.corrupt-20261130T051532Z",
		"checkpoint.json.corrupt-20261130T051532Z-2",
	} {
		garbage := fmt.Sprintf("garbage %d", i)
		if err := os.WriteFile(path, []byte(garbage), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Load(ctx); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Load error = %v, want ErrCorrupt", err)
		}
		got, err := quarantine(path, now)
		if err != nil {
			t.Fatalf("quarantine: %v", err)
		}
		if want := filepath.Join(dir, wantName); got != want {
			t.Errorf("quarantined as %s, want %s", got, want)
		}
		if content, err := os.ReadFile(got); err != nil || string(content) != garbage {
			t.Errorf("quarantined file holds %q (%v), want %q", content, err, garbage)
		}
		// The original stays until the caller replaces it: a crash
		// before that must not leave "no checkpoint" behind.
		if content, err := os.ReadFile(path); err != nil || string(content) != garbage {
			t.Errorf("checkpoint after quarantine holds %q (%v), want it untouched", content, err)
		}
		// Quarantining it again (a crash before the rebuilt file was
		// saved) keeps the one copy.
		if again, err := quarantine(path, now.Add(time.Hour)); err != nil || again != got {
			t.Errorf("second quarantine = %s, %v; want the existing copy %s", again, err, got)
		}
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if got, err := Quarantine(path); err == nil {
		t.Errorf("Quarantine of a missing file returned %s, want an error", got)
	}
}

func TestCheckpointHelpers(t *testing.T) {
	var c Checkpoint // the zero value is usable
	if _, ok := c.Get("x"); ok {
		t.Error("Get on an empty checkpoint found a claim")
	}
	for _, uid := range []types.UID{"c", "a", "b"} {
		c.Put(&PreparedClaim{UID: uid, State: PrepareStarted})
	}
	c.Put(&PreparedClaim{UID: "b", State: PrepareCompleted})
	if got, ok := c.Get("b"); !ok || got.State != PrepareCompleted {
		t.Errorf("Get(b) = %+v, %v; want the replaced record", got, ok)
	}
	c.Delete("c")
	c.Delete("missing")

	var order []types.UID
	for uid, claim := range c.All() {
		if claim.UID != uid {
			t.Errorf("All yielded %s with claim %s", uid, claim.UID)
		}
		order = append(order, uid)
	}
	if diff := cmp.Diff([]types.UID{"a", "b"}, order); diff != "" {
		t.Errorf("All order (-want +got):\n%s", diff)
	}
	if c.Len() != 2 {
		t.Errorf("Len = %d, want 2", c.Len())
	}
	for range c.All() {
		break // stopping early must not panic
	}
}

// withData wraps data in an envelope with a correct checksum.
func withData(data string) []byte {
	return fmt.Appendf(nil, `{"version":"v1","checksum":%q,"data":%s}`, checksum([]byte(data)), data)
}

// copyToTemp copies a fixture into a temporary directory, so tests that write
// never touch testdata.
func copyToTemp(t *testing.T, fixture string) string {
	t.Helper()
	content, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
