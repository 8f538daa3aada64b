// Package plugintest runs the real kubelet plugin (pkg/nodeplugin.Run) on a
// simulated machine against a fake clientset, with a kubelet stand-in
// connected to its sockets.
package plugintest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-dra/gpu-dra-driver/internal/fakeapi"
	"github.com/gpu-dra/gpu-dra-driver/internal/kubeletstandin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Dirs are the host directories a plugin instance uses; they outlive
// restarts of the plugin, like a node's.
type Dirs struct {
	Root, PluginData, Registrar, CDI string
}

// NewDirs lays out the directories under root (keep it short: unix socket
// paths are limited to 108 bytes).
func NewDirs(root string) (Dirs, error) {
	d := Dirs{
		Root:       root,
		PluginData: filepath.Join(root, "plugin"),
		Registrar:  filepath.Join(root, "reg"),
		CDI:        filepath.Join(root, "cdi"),
	}
	for _, dir := range []string{d.PluginData, d.Registrar, d.CDI} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return d, err
		}
	}
	return d, nil
}

// Config returns the plugin configuration for a simulated machine.
func (d Dirs) Config(machine, node string) *nodeplugin.Config {
	return &nodeplugin.Config{
		DriverName:    vocabulary.DriverName,
		NodeName:      node,
		PluginDataDir: d.PluginData,
		RegistrarDir:  d.Registrar,
		CDIDir:        d.CDI,
		MPSDir:        filepath.Join(d.Root, "mps"),
		Simulate:      machine,
		Out:           os.Stdout,
	}
}

// FakeClient returns a clientset holding the node and the claims.
func FakeClient(node string, claims ...*resourceapi.ResourceClaim) *fake.Clientset {
	objs := []runtime.Object{&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}}}
	for _, c := range claims {
		objs = append(objs, c)
	}
	client := fake.NewClientset(objs...)
	fakeapi.GenerateNames(client)
	return client
}

// Plugin is a running plugin instance.
type Plugin struct {
	Kubelet *kubeletstandin.Kubelet
	cancel  context.CancelFunc
	done    chan error
}

// Start runs the plugin and registers the kubelet stand-in with it.
func Start(ctx context.Context, cfg *nodeplugin.Config) (*Plugin, error) {
	// A previous instance's registration socket must not be mistaken
	// for this one's.
	_ = os.RemoveAll(cfg.RegistrarDir)
	if err := os.MkdirAll(cfg.RegistrarDir, 0o750); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Plugin{cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- nodeplugin.Run(ctx, cfg) }()
	k, err := kubeletstandin.Register(ctx, cfg.RegistrarDir, 30*time.Second)
	if err != nil {
		cancel()
		return nil, errors.Join(err, <-p.done)
	}
	p.Kubelet = k
	return p, nil
}

// Stop shuts the plugin down gracefully and returns Run's result.
func (p *Plugin) Stop() error {
	_ = p.Kubelet.Close()
	p.cancel()
	select {
	case err := <-p.done:
		return err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("plugin did not stop within 30s")
	}
}

// BuildMPSControl builds the simulated nvidia-cuda-mps-control
// (cmd/mps-control-sim) into dir and returns its path; the plugin finds it
// beside its own binary in a real deployment.
func BuildMPSControl(dir string) (string, error) {
	out := filepath.Join(dir, "mps-control-sim")
	cmd := exec.Command("go", "build", "-o", out, "github.com/gpu-dra/gpu-dra-driver/cmd/mps-control-sim")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build mps-control-sim: %w\n%s", err, msg)
	}
	return out, nil
}
