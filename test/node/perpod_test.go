package node

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
)

// cdiEdits is what a claim's CDI spec gives every container.
type cdiEdits struct {
	ContainerEdits struct {
		Env    []string `json:"env"`
		Mounts []struct {
			HostPath      string `json:"hostPath"`
			ContainerPath string `json:"containerPath"`
		} `json:"mounts"`
	} `json:"containerEdits"`
}

// TestLoadSim (a short name: the socket path below t.TempDir must fit in
// 108 bytes): the real load program, given what the claim's CDI spec gives a container
// (NVIDIA_VISIBLE_DEVICES and the simulated driver's socket directory),
// registers with the plugin: its process appears in the plugin's
// per-container readings with its declared SM share and memory (in no
// pod: the test runs it outside Kubernetes), on the loopback metrics port,
// and disappears when it stops its load.
func TestLoadSim(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dirs, _, claims, _ := setup(t, map[string]int64{"job": 1})
	loadSim, err := pluginrun.BuildLoadSim(dirs.Root)
	if err != nil {
		t.Fatal(err)
	}
	cfg := dirs.Config(machine, nodeName)
	cfg.KubeClient = apiserver.NodeClient(nodeName, claims["job"])
	p := startWithMetrics(ctx, t, cfg)
	if _, err := p.Kubelet.PrepareOne(ctx, claims["job"]); err != nil {
		t.Fatal(err)
	}

	specs, err := filepath.Glob(filepath.Join(dirs.CDI, "*.json"))
	if err != nil || len(specs) != 1 {
		t.Fatalf("CDI specs %v (%v), want the claim's", specs, err)
	}
	raw, err := os.ReadFile(specs[0])
	if err != nil {
		t.Fatal(err)
	}
	var spec cdiEdits
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, e := range spec.ContainerEdits.Env {
		if strings.HasPrefix(e, "NVIDIA_VISIBLE_DEVICES=") {
			env = append(env, e)
		}
	}
	socketDir := ""
	for _, m := range spec.ContainerEdits.Mounts {
		if m.ContainerPath == "/run/nvidia-sim" {
			socketDir = m.HostPath
		}
	}
	if len(env) != 1 || socketDir == "" {
		t.Fatalf("the CDI spec gives no NVIDIA_VISIBLE_DEVICES (%v) or no /run/nvidia-sim mount:\n%s", env, raw)
	}
	uuid := strings.TrimPrefix(env[0], "NVIDIA_VISIBLE_DEVICES=")

	load := exec.CommandContext(ctx, loadSim, "--sm=35", "--memory=3Gi", "--socket="+filepath.Join(socketDir, "processes.sock"))
	load.Env = append(os.Environ(), env...)
	var out strings.Builder
	load.Stdout, load.Stderr = &out, &out
	if err := load.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = load.Process.Kill()
		_ = load.Wait()
	}()
	processes := regexp.MustCompile(`gpu_dra_container_processes\{claim="",[^}]*uuid="` + uuid + `"\} (\d+)`)
	smOf := regexp.MustCompile(`gpu_dra_container_sm_utilization_ratio\{claim="",[^}]*uuid="` + uuid + `"\} ([0-9.]+)`)
	memOf := regexp.MustCompile(`gpu_dra_container_memory_used_bytes\{claim="",[^}]*uuid="` + uuid + `"\} ([0-9.e+]+)`)
	var body string
	eventually(t, 20*time.Second, "the load's process in /metrics", func() bool {
		body = scrape(t, cfg.LocalMetricsAddress)
		m := processes.FindStringSubmatch(body)
		return m != nil && m[1] == "1"
	})
	if m := smOf.FindStringSubmatch(body); m == nil || m[1] != "0.35" {
		t.Errorf("SM reading %v, want 0.35 (the load's --sm=35)", m)
	}
	if m := memOf.FindStringSubmatch(body); m == nil || m[1] != "3.221225472e+09" {
		t.Errorf("memory reading %v, want 3Gi", m)
	}

	if err := load.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the stopped load gone from /metrics", func() bool {
		return processes.FindStringSubmatch(scrape(t, cfg.LocalMetricsAddress)) == nil
	})
	if !strings.Contains(out.String(), "Load running: 35% SM") || !strings.Contains(out.String(), "Load stopped") {
		t.Errorf("the load program's output:\n%s", out.String())
	}
}

// startWithMetrics starts cfg's plugin in-process with its metrics and
// local metrics on free loopback addresses, stopped when the test ends.
func startWithMetrics(ctx context.Context, t *testing.T, cfg *nodeplugin.Config) *inprocess.Plugin {
	t.Helper()
	cfg.MetricsAddress = freeAddress(t)
	cfg.LocalMetricsAddress = freeAddress(t)
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return p
}
