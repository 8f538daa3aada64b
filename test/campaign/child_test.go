package campaign

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/childproc"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// The plugin child and the campaign share the node root. Claims are
// allocated while the plugin runs, so the child's fake API server reads
// each claim from claimsDir when the kubelet helper GETs it. The campaign
// drives the child's simulated GPUs (NVML errors, lost GPUs) through
// controlFile: it writes a command, the child applies it and removes it.
const (
	claimsDir   = "claims"
	controlFile = "nvml-control.json"
	slicesFile  = "slices.json"
	mpsControl  = "mps-control-sim"
)

// nvmlCommand is one control request to the child's simulated machine.
type nvmlCommand struct {
	Inject []injectedError `json:"inject,omitempty"`
	// Lost sets GPUs (by index) lost or back.
	Lost  map[int]bool `json:"lost,omitempty"`
	Clear bool         `json:"clear,omitempty"`
}

type injectedError struct {
	Method string      `json:"method"`
	GPU    int         `json:"gpu"`
	Ret    nvml.Return `json:"ret"`
	Times  int         `json:"times"`
}

func claimFile(root, namespace, name string) string {
	return filepath.Join(root, claimsDir, namespace+"_"+name+".json")
}

// runChild is the plugin process: the real plugin over the campaign's node
// directories, dying at the fault point it was started with.
func runChild(root string) error {
	dirs, err := pluginrun.NewDirs(root)
	if err != nil {
		return err
	}
	cfg := dirs.Config(machine, nodeName)
	cfg.MPSControl = filepath.Join(root, mpsControl)
	cfg.StaleClaimGracePeriod = staleGrace
	cfg.PodResourcesSocket = filepath.Join(root, podResourcesSocket)
	// Every GPU may also be passed through to a virtual machine.
	cfg.DevicePolicyFile = filepath.Join(root, "device-policy.yaml")
	if err := os.WriteFile(cfg.DevicePolicyFile, []byte("default: {passthrough: true}\n"), 0o644); err != nil {
		return err
	}
	client := apiserver.NodeClient(nodeName)
	client.PrependReactor("get", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		get := a.(k8stesting.GetAction)
		data, err := os.ReadFile(claimFile(root, get.GetNamespace(), get.GetName()))
		if errors.Is(err, fs.ErrNotExist) {
			return true, nil, apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), get.GetName())
		}
		if err != nil {
			return true, nil, err
		}
		claim := &resourceapi.ResourceClaim{}
		return true, claim, json.Unmarshal(data, claim)
	})
	cfg.KubeClient = client
	go mirrorSlices(root, client)
	// The journal shows which process mutated when (hand-overs).
	journal := childproc.Journaling(root, nil)
	cfg.FaultHook = childproc.Journaling(root, childproc.KillAt(root, childproc.CrashAt()))
	cfg.SimulationHook = func(m *nvmlsim.Machine) { journal(stepOwns); go obeyControl(root, m) }
	if err := configureIMEX(root, cfg); err != nil {
		return err
	}
	childproc.ConfigurePod(cfg)
	return afterServe(root, journal, childproc.Serve(cfg))
}

// obeyControl applies the campaign's control commands to the simulated
// machine until the process ends.
func obeyControl(root string, m *nvmlsim.Machine) {
	path := filepath.Join(root, controlFile)
	for range time.Tick(5 * time.Millisecond) {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var cmd nvmlCommand
		if err := json.Unmarshal(data, &cmd); err != nil {
			fmt.Fprintln(os.Stderr, "campaign control:", err)
			_ = os.Remove(path)
			continue
		}
		if cmd.Clear {
			m.ClearErrors()
		}
		for _, e := range cmd.Inject {
			m.InjectError(e.Method, e.GPU, e.Ret, e.Times)
		}
		for gpu, lost := range cmd.Lost {
			if err := m.SetGPULost(gpu, lost); err != nil {
				fmt.Fprintln(os.Stderr, "campaign control:", err)
			}
		}
		_ = os.Remove(path) // the acknowledgement
	}
}

// publishedSlices is what the plugin published, as the scheduler sees it.
type publishedSlices struct {
	PID    int                         `json:"pid"`
	Slices []resourceapi.ResourceSlice `json:"slices"`
}

// mirrorSlices writes the ResourceSlices the plugin published to its fake
// API server into slicesFile whenever they change, so the campaign
// allocates from what this plugin instance publishes.
func mirrorSlices(root string, client kubernetes.Interface) {
	var last []byte
	for range time.Tick(20 * time.Millisecond) {
		list, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			continue
		}
		slices.SortFunc(list.Items, func(a, b resourceapi.ResourceSlice) int { return strings.Compare(a.Name, b.Name) })
		data, err := json.Marshal(publishedSlices{PID: os.Getpid(), Slices: list.Items})
		if err != nil || bytes.Equal(data, last) {
			continue
		}
		path := filepath.Join(root, slicesFile)
		if os.WriteFile(path+".tmp", data, 0o644) == nil && os.Rename(path+".tmp", path) == nil {
			last = data
		}
	}
}

// readSlices waits for a complete set of slices published by process pid:
// every slice of the newest pool generation, as many as the pool counts.
func readSlices(root string, pid int, timeout time.Duration) ([]*resourceapi.ResourceSlice, error) {
	deadline := time.Now().Add(timeout)
	for ; time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		data, err := os.ReadFile(filepath.Join(root, slicesFile))
		if err != nil {
			continue
		}
		var p publishedSlices
		if err := json.Unmarshal(data, &p); err != nil || p.PID != pid || len(p.Slices) == 0 {
			continue
		}
		var gen int64
		for _, s := range p.Slices {
			gen = max(gen, s.Spec.Pool.Generation)
		}
		var out []*resourceapi.ResourceSlice
		for i := range p.Slices {
			if p.Slices[i].Spec.Pool.Generation == gen {
				out = append(out, &p.Slices[i])
			}
		}
		if int64(len(out)) == out[0].Spec.Pool.ResourceSliceCount {
			return out, nil
		}
	}
	return nil, fmt.Errorf("plugin %d published no complete set of ResourceSlices within %v", pid, timeout)
}
