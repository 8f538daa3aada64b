package prepare

import (
	"context"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// A repeated prepare of a prepared claim returns the recorded result
// without decoding its config again, but only for the same allocation.
func TestRePrepare(t *testing.T) {
	claimSrc := resourceapi.AllocationConfigSourceClaim
	tests := map[string]struct {
		again   *resourceapi.ResourceClaim
		wantErr []string // substrings; none: the recorded result
	}{
		"same allocation": {again: allocated("c", []string{"gpu-0"})},
		// As if a newer plugin validated configs more strictly.
		"config no longer valid": {again: allocated("c", []string{"gpu-0"}, opaque(claimSrc, testDriver, badField))},
		"other device, same UID": {again: allocated("c", []string{"gpu-1"}), wantErr: []string{"node-1/gpu-0", "node-1/gpu-1", "unprepared"}},
		"extra device, same UID": {again: allocated("c", []string{"gpu-0", "gpu-1"}), wantErr: []string{"req1:node-1/gpu-1"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := newTestDriver(t, nil)
			first := allocated("c", []string{"gpu-0"})
			res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{first})
			if err != nil || res[first.UID].Err != nil {
				t.Fatalf("first prepare: %v %v", err, res[first.UID].Err)
			}
			want := res[first.UID].Devices
			res, err = d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{tc.again})
			if err != nil {
				t.Fatal(err)
			}
			got := res[tc.again.UID]
			if len(tc.wantErr) == 0 {
				if got.Err != nil {
					t.Fatalf("re-prepare: %v", got.Err)
				}
				if len(got.Devices) != 1 || got.Devices[0].DeviceName != "gpu-0" || !slices.Equal(got.Devices[0].CDIDeviceIDs, want[0].CDIDeviceIDs) {
					t.Fatalf("re-prepare devices = %+v, want the recorded %+v", got.Devices, want)
				}
				return
			}
			if got.Err == nil {
				t.Fatalf("re-prepare with another allocation returned %+v, want an error", got.Devices)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(got.Err.Error(), want) {
					t.Errorf("error %q does not name %q", got.Err, want)
				}
			}
			if cl := d.PreparedClaims(); len(cl) != 1 || cl[0].Devices[0].Device != "gpu-0" {
				t.Errorf("the refused re-prepare changed the record: %+v", cl)
			}
		})
	}
}

// The pods a claim is reserved for are recorded at prepare, and those of a
// later prepare of the prepared claim (a second pod sharing it) added, so
// that a stale release can ask whether they still run (pkg/staleclaims).
func TestPrepareRecordsPods(t *testing.T) {
	d := newTestDriver(t, nil)
	claim := allocated("c", []string{"gpu-0"})
	reserve := func(names ...string) {
		claim.Status.ReservedFor = nil
		for _, n := range names {
			claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: n, UID: types.UID(n + "-uid")})
		}
		claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{APIGroup: "example.com", Resource: "jobs", Name: "j", UID: "j-uid"})
		res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
		if err != nil || res[claim.UID].Err != nil {
			t.Fatalf("prepare: %v %v", err, res[claim.UID].Err)
		}
	}
	reserve("a")
	reserve("a", "b")
	want := []checkpoint.ReservedPod{{Name: "a", UID: "a-uid"}, {Name: "b", UID: "b-uid"}}
	if cl := d.PreparedClaims(); len(cl) != 1 || !slices.Equal(cl[0].Pods, want) {
		t.Errorf("recorded pods %+v, want %+v", cl, want)
	}
	saved, err := d.store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := saved.Get(claim.UID); !ok || !slices.Equal(c.Pods, want) {
		t.Errorf("saved pods %+v, want %+v", c, want)
	}
}
