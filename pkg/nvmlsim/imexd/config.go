// Package imexd simulates NVIDIA's IMEX daemon (nvidia-imex) and its control
// command (nvidia-imex-ctl) for demos and tests, in the style of
// pkg/nvmlsim/mpscontrol. It shares no GPU memory: it keeps the daemon's
// interface, so that code that runs IMEX daemons for compute domains runs
// unchanged on the simulated trays of pkg/nvmlsim (gb200nvl72@RACK).
// cmd/imex-sim is its command; installed as nvidia-imex it is the daemon, as
// nvidia-imex-ctl the control command.
//
// What it keeps of the real interface (docs/compute-domains.md says where each
// comes from):
//
//	nvidia-imex -c CONFIG        run the daemon in the foreground
//	nvidia-imex-ctl [-c CONFIG] -q   print READY when the local daemon serves
//	nvidia-imex-ctl [-c CONFIG] -N   the domain's nodes, their state and the
//	                                 connectivity table (C connected, N never
//	                                 connected, D disconnected, I invalid:
//	                                 that node's view is not available)
//
// The config file (default /etc/nvidia-imex/config.cfg) is KEY=VALUE lines;
// the simulation reads SERVER_PORT (peers' port, default 50000),
// IMEX_CMD_PORT (default 50005), IMEX_CMD_ENABLED (the control command needs
// 1), IMEX_CMD_BIND_INTERFACE_IP (the address the daemon serves on, which the
// simulation also takes for its own node's address: simulated nodes are
// loopback addresses, 127.0.0.2, 127.0.0.3, ...) and IMEX_NODE_CONFIG_FILE
// (default /etc/nvidia-imex/nodes_config.cfg: one node address a line, the
// node's own among them). DAEMONIZE=1 is refused: the simulation only runs in
// the foreground. Other keys are ignored. SIGUSR1 makes the daemon re-read its
// node list, as the real daemon does, so peers can come and go without a
// restart.
package imexd

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// DefaultConfigPath is the config file the commands read without -c.
const DefaultConfigPath = "/etc/nvidia-imex/config.cfg"

// Config is what the simulation reads of a config file.
type Config struct {
	ServerPort     int
	CmdPort        int
	CmdEnabled     bool
	BindIP         string
	NodeConfigFile string
}

// ReadConfig reads the daemon's config file.
func ReadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c := &Config{ServerPort: 50000, CmdPort: 50005, NodeConfigFile: "/etc/nvidia-imex/nodes_config.cfg"}
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want KEY=VALUE, got %q", path, n+1, line)
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		switch key {
		case "SERVER_PORT", "IMEX_CMD_PORT":
			port, err := strconv.Atoi(value)
			if err != nil || port <= 0 || port > 65535 {
				return nil, fmt.Errorf("%s:%d: %s=%q: want a port number", path, n+1, key, value)
			}
			if key == "SERVER_PORT" {
				c.ServerPort = port
			} else {
				c.CmdPort = port
			}
		case "IMEX_CMD_ENABLED":
			c.CmdEnabled = value == "1"
		case "IMEX_CMD_BIND_INTERFACE_IP":
			if net.ParseIP(value) == nil {
				return nil, fmt.Errorf("%s:%d: IMEX_CMD_BIND_INTERFACE_IP=%q: want an IP address", path, n+1, value)
			}
			c.BindIP = value
		case "IMEX_NODE_CONFIG_FILE":
			c.NodeConfigFile = value
		case "DAEMONIZE":
			if value == "1" {
				return nil, fmt.Errorf("%s:%d: DAEMONIZE=1: the simulated daemon runs in the foreground only", path, n+1)
			}
		}
	}
	if c.BindIP == "" {
		return nil, fmt.Errorf("%s: IMEX_CMD_BIND_INTERFACE_IP is not set: the simulated daemon needs its node's address", path)
	}
	return c, nil
}

// ReadNodes reads a node list: one address a line; blank lines and # comments
// are skipped.
func ReadNodes(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var nodes []string
	seen := map[string]bool{}
	scan := bufio.NewScanner(f)
	for n := 1; scan.Scan(); n++ {
		line := strings.TrimSpace(scan.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if net.ParseIP(line) == nil {
			return nil, fmt.Errorf("%s:%d: %q is not an IP address (the simulation takes addresses, not names)", path, n, line)
		}
		if !seen[line] {
			seen[line] = true
			nodes = append(nodes, line)
		}
	}
	return nodes, scan.Err()
}
