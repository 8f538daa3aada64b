package nodeplugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/imex"
	"github.com/gpu-dra/gpu-dra-driver/pkg/imexdomain"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/simhooks"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// IMEXConfig says how the node runs the IMEX daemons of compute domains
// (docs/compute-domains.md).
type IMEXConfig struct {
	// NodeIP is the address the node's daemon serves on (the plugin pod's
	// IP); empty: no daemons, channel claims are refused.
	NodeIP string
	// Daemon is nvidia-imex; empty: the driver root's (in simulation,
	// imex-sim beside the plugin, linked into the simulated driver root).
	Daemon              string
	ServerPort, CmdPort int
	PollPeriod          time.Duration
	// DynamicClient, when set, replaces the ComputeDomain client built
	// from Kubeconfig (tests).
	DynamicClient dynamic.Interface
}

func (c *IMEXConfig) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.NodeIP, "imex-node-ip", "", "Address this node's IMEX daemon serves its peers on: the plugin pod's IP (POD_IP from the downward API). Empty: the node runs no IMEX daemons and refuses compute domain channel claims (docs/compute-domains.md).")
	fs.StringVar(&c.Daemon, "imex-daemon", "", "nvidia-imex to run, with nvidia-imex-ctl beside it; default: the driver root's usr/bin/nvidia-imex (in simulation, imex-sim beside this binary, linked into the simulated driver root as nvidia-imex and nvidia-imex-ctl).")
	fs.IntVar(&c.ServerPort, "imex-server-port", 50000, "Port IMEX daemons serve their peers on (SERVER_PORT); the same on every node.")
	fs.IntVar(&c.CmdPort, "imex-cmd-port", 50005, "Port of the IMEX daemon's command service (IMEX_CMD_PORT), which nvidia-imex-ctl asks.")
	fs.DurationVar(&c.PollPeriod, "imex-poll-period", 5*time.Second, "How often the node's IMEX daemon is asked for its peers' state (nvidia-imex-ctl -N) for its ComputeDomain status entry.")
}

func (c *IMEXConfig) validate() error {
	if c.NodeIP != "" && net.ParseIP(c.NodeIP) == nil {
		return fmt.Errorf("--imex-node-ip=%q: not an IP address", c.NodeIP)
	}
	for _, p := range []struct {
		flag string
		port int
	}{{"--imex-server-port", c.ServerPort}, {"--imex-cmd-port", c.CmdPort}} {
		if c.NodeIP != "" && (p.port < 1 || p.port > 65535) {
			return fmt.Errorf("%s=%d: want 1..65535", p.flag, p.port)
		}
	}
	if c.NodeIP != "" && c.ServerPort == c.CmdPort {
		return fmt.Errorf("--imex-server-port and --imex-cmd-port are both %d: the daemon serves two services", c.ServerPort)
	}
	if c.PollPeriod < 0 {
		return fmt.Errorf("--imex-poll-period=%s: must not be negative", c.PollPeriod)
	}
	return nil
}

// imexNode sets up the node's compute domain service; nil when the node
// runs no IMEX daemons (no --imex-node-ip, or no nvidia-imex).
func imexNode(ctx context.Context, cfg *Config, hw *hardware, client kubernetes.Interface) (*imexdomain.Node, error) {
	logger := klog.FromContext(ctx)
	c := cfg.IMEX
	if c.NodeIP == "" {
		logger.V(2).Info("No --imex-node-ip: this node runs no IMEX daemons; compute domain channel claims are refused")
		return nil, nil
	}
	daemon := c.Daemon
	if hw.sim != nil {
		program := c.Daemon
		if program == "" {
			program = simhooks.IMEX()
		}
		if program == "" {
			logger.Info("No simulated IMEX daemon (imex-sim) beside the plugin; compute domain channel claims are refused")
			return nil, nil
		}
		if err := simhooks.InstallIMEX(hw.driverRoot, program); err != nil {
			// The GPUs are served all the same.
			logger.Error(err, "Install the simulated IMEX daemon in the simulated driver root; compute domain channel claims are refused")
			return nil, nil
		}
		daemon = ""
	}
	if daemon == "" {
		daemon = filepath.Join(hw.driverRoot, "usr/bin/nvidia-imex")
	}
	if _, err := os.Stat(daemon); err != nil {
		logger.Info("No nvidia-imex; compute domain channel claims are refused", "path", daemon, "err", err)
		return nil, nil
	}
	dyn := c.DynamicClient
	if dyn == nil {
		rc, err := cfg.Options.RESTConfig(nil, vocabulary.KubeletPluginAgent+"/"+cfg.DriverName)
		if err != nil {
			return nil, err
		}
		if dyn, err = dynamic.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("ComputeDomain client: %w", err)
		}
	}
	mgr := imex.NewManager(imex.Config{
		Binary: daemon, StateDir: filepath.Join(cfg.PluginDataDir, "imex"),
		Env:    []string{"LD_LIBRARY_PATH=" + filepath.Join(hw.driverRoot, "usr/lib/x86_64-linux-gnu")},
		NodeIP: c.NodeIP, ServerPort: c.ServerPort, CmdPort: c.CmdPort,
	})
	logger.Info("Compute domains: this node runs their IMEX daemons", "daemon", daemon, "nodeIP", c.NodeIP)
	opts := imexdomain.Options{
		Manager: mgr, Client: dyn, Events: client.CoreV1(), NodeName: cfg.NodeName, NodeIP: c.NodeIP,
		Ctl: filepath.Join(filepath.Dir(daemon), "nvidia-imex-ctl"), PollPeriod: c.PollPeriod,
	}
	if hw.sim != nil {
		// The simulated kernel's majors, and its nodes' stand-in numbers.
		opts.ProcDevices, opts.ChannelStandIn = nvmlsim.ProcDevicesFile(hw.driverRoot), nvmlsim.DeviceNodeStandIn
	}
	return imexdomain.New(opts), nil
}

// cliqueOf is the NVLink clique of the node's GPUs, "" when they have none
// or more than one.
func cliqueOf(ctx context.Context, gpus []discovery.GPU) string {
	ids := make([]string, len(gpus))
	for i, g := range gpus {
		ids[i] = g.CliqueID
	}
	clique, ok := vocabulary.CommonClique(ids...)
	if !ok {
		klog.FromContext(ctx).Info("The node's GPUs are in more than one NVLink clique; it serves no compute domain", "cliques", ids)
	}
	return clique
}
