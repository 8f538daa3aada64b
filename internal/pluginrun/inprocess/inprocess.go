// Package inprocess runs the real kubelet plugin (pkg/nodeplugin.Run) in the
// test's own process, with the kubelet stand-in (internal/standin/kubelet)
// registered on its sockets.
package inprocess

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/internal/standin/kubelet"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
)

// Plugin is a running plugin instance.
type Plugin struct {
	Kubelet *kubelet.Kubelet
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
	k, err := kubelet.Register(ctx, cfg.RegistrarDir, 30*time.Second)
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
