package scenarios

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// KubectlGPU runs the kubectl gpu plugin (r.KubectlGPUPath) against the cluster and
// returns its standard output.
func (r *Runner) KubectlGPU(ctx context.Context, args ...string) (string, error) {
	if r.KubectlGPUPath == "" {
		return "", fmt.Errorf("no kubectl-gpu binary given (make build puts one in bin/)")
	}
	args = append([]string{"--kubeconfig", r.Cluster.Kubeconfig, "--driver", r.Driver}, args...)
	cmd := exec.CommandContext(ctx, r.KubectlGPUPath, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl gpu %s: %w: %s", strings.Join(args[4:], " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// KubectlGPUJSON runs kubectl gpu with -o json and decodes the output into out.
func (r *Runner) KubectlGPUJSON(ctx context.Context, out any, args ...string) error {
	text, err := r.KubectlGPU(ctx, append(args, "-o", "json")...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(text), out); err != nil {
		return fmt.Errorf("kubectl gpu %s -o json: %w", strings.Join(args, " "), err)
	}
	return nil
}

// gpuUse is what the ResourceClaims say one GPU is used for.
type gpuUse struct {
	whole  int
	mig    map[string]int            // profile -> devices
	shares map[vocabulary.Kind]int64 // timeslice|mps -> shares
	claims map[string]bool
}

// CheckKubectlGPU compares what `kubectl gpu nodes -o json` and `kubectl gpu claims
// -A -o json` say with the allocations recorded in the ResourceClaims (joined to the
// slices' attributes here, independently of kubectl gpu): per GPU whole use, MIG
// devices by profile, time-slicing and MPS shares, free GPUs and totals; per claim the
// allocated devices and share IDs. It returns the differences.
func (r *Runner) CheckKubectlGPU(ctx context.Context) ([]string, error) {
	devices, err := r.deviceIndex(ctx)
	if err != nil {
		return nil, err
	}
	claims, err := r.Cluster.Client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var nodes kubectlgpu.NodeList
	if err := r.KubectlGPUJSON(ctx, &nodes, "nodes"); err != nil {
		return nil, err
	}
	var list kubectlgpu.ClaimList
	if err := r.KubectlGPUJSON(ctx, &list, "claims", "-A"); err != nil {
		return nil, err
	}
	var problems []string
	fail := func(format string, args ...any) {
		problems = append(problems, "kubectl gpu: "+fmt.Sprintf(format, args...))
	}

	// What the claims say, per pool/GPU and per claim.
	uses := map[string]*gpuUse{} // pool/minor
	wantClaims := map[string][]string{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		key := c.Namespace + "/" + c.Name
		for _, res := range c.Status.Allocation.Devices.Results {
			if res.Driver != r.Driver {
				continue
			}
			d := DeviceReport{Attributes: devices[res.Driver+"/"+res.Pool+"/"+res.Device]}
			share := ""
			if res.ShareID != nil {
				share = string(*res.ShareID)
			}
			wantClaims[key] = append(wantClaims[key], res.Pool+"/"+res.Device+"#"+share)
			gk := res.Pool + "/" + d.GPU()
			u := uses[gk]
			if u == nil {
				u = &gpuUse{mig: map[string]int{}, shares: map[vocabulary.Kind]int64{}, claims: map[string]bool{}}
				uses[gk] = u
			}
			u.claims[key] = true
			switch t := deviceKind(d.Attributes); t {
			case vocabulary.KindGPU:
				u.whole++
			case vocabulary.KindMIG:
				u.mig[d.Attributes[vocabulary.AttrProfile]]++
			case vocabulary.KindTimeSlice, vocabulary.KindMPS:
				// A share consumes its "shares" capacity (1 when not recorded).
				n := int64(1)
				if q, ok := res.ConsumedCapacity[vocabulary.CapacityShares]; ok {
					n = q.Value()
				}
				u.shares[t] += n
			default:
				fail("claim %s: device %s/%s has unknown type %q", key, res.Pool, res.Device, t)
			}
		}
	}

	// nodes -o json against the claims.
	var total kubectlgpu.Total
	for _, n := range nodes.Nodes {
		free := 0
		for _, g := range n.GPUs {
			u := uses[n.Name+"/"+strconv.FormatInt(g.Minor, 10)]
			delete(uses, n.Name+"/"+strconv.FormatInt(g.Minor, 10))
			if u == nil {
				u = &gpuUse{mig: map[string]int{}, shares: map[vocabulary.Kind]int64{}, claims: map[string]bool{}}
				free++
			}
			where := fmt.Sprintf("node %s %s", n.Name, g.Name)
			if g.Usage.Whole != (u.whole > 0) {
				fail("%s: whole=%v, the claims allocate it whole %d times", where, g.Usage.Whole, u.whole)
			}
			mig := map[string]int{}
			for _, p := range g.Usage.MIG {
				mig[p.Profile] += p.Count
				total.MIGDevices += p.Count
			}
			if fmt.Sprint(mig) != fmt.Sprint(u.mig) {
				fail("%s: MIG devices %v, the claims hold %v", where, mig, u.mig)
			}
			shares := map[vocabulary.Kind]int64{}
			for _, s := range g.Usage.Shares {
				shares[s.Type] += s.Used
				total.Shares += s.Used
			}
			if fmt.Sprint(shares) != fmt.Sprint(u.shares) {
				fail("%s: shares %v, the claims hold %v", where, shares, u.shares)
			}
			if got, want := strings.Join(slices.Sorted(slices.Values(g.Usage.Claims)), ","), strings.Join(slices.Sorted(maps.Keys(u.claims)), ","); got != want {
				fail("%s: claims %q, want %q", where, got, want)
			}
			wantState := kubectlgpu.StateFree
			switch {
			case u.whole > 0:
				wantState = kubectlgpu.StateWhole
			case len(u.mig) > 0:
				wantState = kubectlgpu.StateMIG
			case u.shares[vocabulary.KindTimeSlice] > 0:
				wantState = kubectlgpu.StateTimeSlicing
			case u.shares[vocabulary.KindMPS] > 0:
				wantState = kubectlgpu.StateMPS
			}
			if g.Usage.State != wantState && g.Usage.State != kubectlgpu.StateMixed {
				fail("%s: state %q, want %q", where, g.Usage.State, wantState)
			}
			switch wantState {
			case kubectlgpu.StateWhole:
				total.Whole++
			case kubectlgpu.StateMIG:
				total.MIG++
			case kubectlgpu.StateTimeSlicing:
				total.TimeSlicing++
			case kubectlgpu.StateMPS:
				total.MPS++
			}
		}
		if n.Free != free {
			fail("node %s: %d free GPUs, the claims leave %d free", n.Name, n.Free, free)
		}
		total.Free += free
		total.GPUs += len(n.GPUs)
	}
	for k := range uses {
		fail("GPU %s holds claims but is not in `kubectl gpu nodes`", k)
	}
	t := nodes.Total
	if t.GPUs != total.GPUs || t.Free != total.Free || t.Whole != total.Whole || t.MIG != total.MIG ||
		t.TimeSlicing != total.TimeSlicing || t.MPS != total.MPS || t.MIGDevices != total.MIGDevices || t.Shares != total.Shares {
		fail("total gpus=%d free=%d whole=%d mig=%d timeSlicing=%d mps=%d migDevices=%d shares=%d, the claims give %d %d %d %d %d %d %d %d",
			t.GPUs, t.Free, t.Whole, t.MIG, t.TimeSlicing, t.MPS, t.MIGDevices, t.Shares,
			total.GPUs, total.Free, total.Whole, total.MIG, total.TimeSlicing, total.MPS, total.MIGDevices, total.Shares)
	}

	// claims -A -o json against the claims.
	seen := map[string]bool{}
	for _, c := range list.Claims {
		key := c.Namespace + "/" + c.Name
		var got []string
		for _, d := range c.Devices {
			got = append(got, d.Pool+"/"+d.Device+"#"+d.ShareID)
		}
		want := wantClaims[key]
		if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
			fail("claim %s: devices %v, its status allocates %v", key, got, want)
		}
		if len(want) > 0 && !strings.HasPrefix(c.State, "allocated") {
			fail("claim %s: state %q, want allocated", key, c.State)
		}
		seen[key] = true
	}
	for key := range wantClaims {
		if !seen[key] {
			fail("claim %s holds devices but is not listed by `kubectl gpu claims -A`", key)
		}
	}
	return problems, nil
}
