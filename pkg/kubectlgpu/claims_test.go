package kubectlgpu_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/golden"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

func TestClaimsGolden(t *testing.T) {
	golden.Check(t, "testdata/claims-all.golden", []byte(mustRun(t, standardCluster(t).client(), claims(""), "")))
}

func TestClaimsTable(t *testing.T) {
	f := standardCluster(t)
	// A claim of another driver is not ours to show.
	other := at.Claim("nic", at.Exactly("nic", "nic.example.com", 1))
	other.Namespace = "default"
	other.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "nic", Driver: "nic.example.com", Pool: "node-a", Device: "nic-0"}},
	}}
	f.objects = append(f.objects, other)
	c := f.client()

	out := mustRun(t, c, claims("default"), "")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.HasPrefix(lines[0], "NAME ") {
		t.Errorf("one namespace has no NAMESPACE column:\n%s", out)
	}
	rows := map[string]string{}
	for _, l := range lines[1:] {
		rows[strings.Fields(l)[0]] = l
	}
	for claim, wants := range map[string][]string{
		"ts-a":        {"allocated,reserved", "node-a", "gpu-0-ts (timeslice: shares 1, compute 25%, memory 19.9Gi)", "TimeSlicing, interval Long (claim)"},
		"ts-b":        {"gpu-0-ts", "TimeSlicing (default)"},
		"train":       {"gpu-1 (whole), gpu-2 (whole)", "Exclusive (default)"},
		"mig-medium":  {"gpu-3-mig-3g40gb-0 (mig 3g.40gb)"},
		"mig-small-1": {"gpu-3-mig-1g10gb-6 (mig 1g.10gb)"},
		"mps-a":       {"gpu-4-mps (mps: shares 1, compute 50%, memory 20Gi)", "MPS, threads 50% (claim)"},
		"waiting":     {"pending", "waiting (not reserved)"},
	} {
		for _, want := range wants {
			if !strings.Contains(rows[claim], want) {
				t.Errorf("claim %s lacks %q: %q", claim, want, rows[claim])
			}
		}
	}
	if len(rows) != 8 {
		t.Errorf("want the 8 claims of namespace default, got:\n%s", out)
	}
	if _, ok := rows["nic"]; ok {
		t.Errorf("a claim of another driver is listed:\n%s", out)
	}

	all := mustRun(t, c, claims(""), "")
	if !strings.HasPrefix(all, "NAMESPACE ") || !strings.Contains(all, "team-b      infer ") {
		t.Errorf("all namespaces:\n%s", all)
	}
	teamB := mustRun(t, c, claims("team-b"), "wide")
	for _, want := range []string{"infer", "node-b", "infer (Running)", "gpu: gpu-0 (whole)", "gpu.dra.dev"} {
		if !strings.Contains(teamB, want) {
			t.Errorf("team-b -o wide lacks %q:\n%s", want, teamB)
		}
	}
	if strings.Contains(teamB, "ts-a") {
		t.Errorf("team-b lists claims of default:\n%s", teamB)
	}
}

func TestClaimsNone(t *testing.T) {
	out, errOut, err := kubectlGPU(t, standardCluster(t).client(), claims("empty"), "")
	if err != nil || out != "" || errOut != "No claims for gpu.dra.dev devices found in namespace \"empty\".\n" {
		t.Errorf("got %v, stdout %q, stderr %q", err, out, errOut)
	}
}

func TestClaimsJSON(t *testing.T) {
	var list kubectlgpu.ClaimList
	if err := json.Unmarshal([]byte(mustRun(t, standardCluster(t).client(), claims(""), "json")), &list); err != nil {
		t.Fatal(err)
	}
	if list.Kind != kubectlgpu.KindClaimList || list.Namespace != "" || len(list.Claims) != 9 {
		t.Fatalf("kind %s, namespace %q, %d claims", list.Kind, list.Namespace, len(list.Claims))
	}
	var tsA kubectlgpu.ClaimStatus
	for _, c := range list.Claims {
		if c.Name == "ts-a" {
			tsA = c
		}
	}
	if tsA.Node != "node-a" || len(tsA.Pods) != 1 || tsA.Pods[0] != (kubectlgpu.PodRef{Name: "ts-a", Phase: "Running", Node: "node-a", Reserved: true}) {
		t.Errorf("ts-a: %+v", tsA)
	}
	d := tsA.Devices[0]
	shares, compute := d.Consumed["shares"], d.Consumed["compute"]
	if d.Device != "gpu-0-ts" || d.Type != vocabulary.KindTimeSlice || d.GPU != "gpu-0" || d.Pool != "node-a" ||
		d.ShareID == "" || shares.Value() != 1 || compute.Value() != 25 {
		t.Errorf("ts-a device %+v", d)
	}
	wantCfg := kubectlgpu.Config{Source: "claim", Kind: "GpuConfig", Strategy: "TimeSlicing", Summary: "TimeSlicing, interval Long",
		Parameters: json.RawMessage(longTimeSlice)}
	var compact bytes.Buffer
	if err := json.Compact(&compact, d.Config.Parameters); err != nil {
		t.Fatal(err)
	}
	d.Config.Parameters = compact.Bytes()
	if diff := cmp.Diff(wantCfg, d.Config); diff != "" {
		t.Errorf("ts-a config (-want +got):\n%s", diff)
	}
}

// The config in effect is chosen as the kubelet plugin chooses it.
func TestConfigInEffect(t *testing.T) {
	gpuCfg := func(sharing string) string {
		return `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":` + sharing + `}`
	}
	opaque := func(source resourceapi.AllocationConfigSource, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
		return resourceapi.DeviceAllocationConfiguration{Source: source, Requests: requests,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: driverName, Parameters: rawJSON(params)}}}
	}
	fromClass := func(params string) resourceapi.DeviceAllocationConfiguration {
		return opaque(resourceapi.AllocationConfigSourceClass, params)
	}
	fromClaim := func(params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
		return opaque(resourceapi.AllocationConfigSourceClaim, params, requests...)
	}
	type configs = []resourceapi.DeviceAllocationConfiguration
	short := gpuCfg(`{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Short"}}`)
	long := gpuCfg(`{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}`)
	exclusive := gpuCfg(`{"strategy":"Exclusive"}`)
	mps := gpuCfg(`{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":30,"defaultPinnedDeviceMemoryLimit":"10Gi","clientPriority":"BelowNormal"}}`)
	tests := map[string]struct {
		device  string // allocated device on node-a
		request string
		configs configs
		want    string
	}{
		"no config on a share":  {"gpu-0-ts", "r", nil, "TimeSlicing (default)"},
		"no config on a whole":  {"gpu-0", "r", nil, "Exclusive (default)"},
		"no config on MIG":      {"gpu-0-mig-1g10gb-6", "r", nil, "Exclusive (default)"},
		"class config":          {"gpu-0-ts", "r", configs{fromClass(short)}, "TimeSlicing, interval Short (class)"},
		"claim wins over class": {"gpu-0-ts", "r", configs{fromClaim(long), fromClass(short)}, "TimeSlicing, interval Long (claim)"},
		"last one wins":         {"gpu-0-ts", "r", configs{fromClaim(long), fromClaim(short)}, "TimeSlicing, interval Short (claim)"},
		"another request":       {"gpu-0-ts", "r", configs{fromClaim(long, "other")}, "TimeSlicing (default)"},
		"parent of subrequest":  {"gpu-0-ts", "r/ts", configs{fromClaim(long, "r")}, "TimeSlicing, interval Long (claim)"},
		"Exclusive on a share":  {"gpu-0-mps", "r", configs{fromClaim(exclusive)}, "MPS, limits from capacity (claim)"},
		"MPS settings":          {"gpu-0-mps", "r", configs{fromClaim(mps)}, "MPS, threads 30%, pinned memory 10Gi, priority BelowNormal (claim)"},
		"other share's strategy": {"gpu-0-ts", "r", configs{fromClaim(gpuCfg(`{"strategy":"MPS"}`))},
			"invalid (claim): sharing strategy MPS does not apply to a timeslice share"},
		"sharing a whole GPU": {"gpu-0", "r", configs{fromClaim(long)},
			"invalid (claim): a whole GPU is allocated exclusively: sharing strategy TimeSlicing is not supported for it"},
		"GpuConfig on MIG": {"gpu-0-mig-1g10gb-6", "r", configs{fromClaim(exclusive)},
			"invalid (claim): a GpuConfig does not apply to a MIG device, use MigDeviceConfig"},
		"undecodable": {"gpu-0", "r", configs{fromClaim(`{"apiVersion":"gpu.dra.dev/v1beta1","kind":"Nope"}`)},
			`invalid (claim): decode config: kind: Unsupported value: "Nope": supported values: "GpuConfig", "MigDeviceConfig", "ComputeDomainChannelConfig"`},
	}
	f := newFixture(t, "node-a=dgxh100")
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			claim := &resourceapi.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default"},
				Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
					Results: []resourceapi.DeviceRequestAllocationResult{{Request: tc.request, Driver: driverName, Pool: "node-a", Device: tc.device}},
					Config:  tc.configs,
				}}},
			}
			src := &kubectlgpu.Source{Claims: []resourceapi.ResourceClaim{*claim}}
			for _, s := range f.slices {
				src.Slices = append(src.Slices, *s)
			}
			list := kubectlgpu.Build(driverName, src).ClaimList("")
			if got := list.Claims[0].Devices[0].Config.String(); got != tc.want {
				t.Errorf("config %q, want %q", got, tc.want)
			}
		})
	}
}

func rawJSON(s string) runtime.RawExtension { return runtime.RawExtension{Raw: []byte(s)} }

// Quantities in consumed capacity may be qualified with the driver's domain.
func TestQualifiedCapacityNames(t *testing.T) {
	f := newFixture(t, "node-a=dgxh100")
	q := resource.MustParse("30")
	claim := resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "r", Driver: driverName, Pool: "node-a", Device: "gpu-2-mps",
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"gpu.dra.dev/compute": q}}},
		}}},
	}
	src := &kubectlgpu.Source{Claims: []resourceapi.ResourceClaim{claim}}
	for _, s := range f.slices {
		src.Slices = append(src.Slices, *s)
	}
	u := kubectlgpu.Build(driverName, src).NodeList().Nodes[0].GPUs[2].Usage
	if len(u.Shares) != 1 || u.Shares[0].ComputePercent != 30 || u.Shares[0].Used != 1 {
		t.Errorf("usage %+v", u)
	}
}
