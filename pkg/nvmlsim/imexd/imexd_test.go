package imexd

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// freePort returns a TCP port free on ip.
func freePort(t *testing.T, ip string) int {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Skipf("cannot listen on %s: %v", ip, err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// node is one simulated node's daemon.
type node struct {
	ip, cfgPath, nodesPath string
	d                      *Daemon
	stop                   context.CancelFunc
	done                   chan struct{}
}

func writeNodes(t *testing.T, path string, ips ...string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(ips, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// startNodes starts a daemon on each of ips, all with the node list ips.
func startNodes(t *testing.T, ips ...string) []*node {
	t.Helper()
	serverPort, cmdPort := freePort(t, ips[0]), freePort(t, ips[0])
	var nodes []*node
	for _, ip := range ips {
		dir := t.TempDir()
		n := &node{ip: ip, cfgPath: filepath.Join(dir, "config.cfg"), nodesPath: filepath.Join(dir, "nodes_config.cfg")}
		writeNodes(t, n.nodesPath, ips...)
		cfg := fmt.Sprintf("SERVER_PORT=%d\nIMEX_CMD_PORT=%d\nIMEX_CMD_ENABLED=1\nIMEX_CMD_BIND_INTERFACE_IP=%s\nIMEX_NODE_CONFIG_FILE=%s\n# a comment\nLOG_FILE_NAME=/dev/null\n",
			serverPort, cmdPort, ip, n.nodesPath)
		if err := os.WriteFile(n.cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		n.start(t)
		nodes = append(nodes, n)
	}
	return nodes
}

func (n *node) start(t *testing.T) {
	t.Helper()
	c, err := ReadConfig(n.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if n.d, err = NewDaemon(c); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.stop, n.done = cancel, make(chan struct{})
	ready := make(chan struct{})
	go func() {
		defer close(n.done)
		if err := n.d.Run(ctx, func() { close(ready) }); err != nil {
			t.Errorf("daemon %s: %v", n.ip, err)
			close(ready)
		}
	}()
	<-ready
	t.Cleanup(func() { cancel(); <-n.done })
}

// ctlOut runs nvidia-imex-ctl with the node's config.
func (n *node) ctl(t *testing.T, cmd string) (string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	rc := Main([]string{"/usr/bin/nvidia-imex-ctl", "-c", n.cfgPath, cmd}, &out, &errOut)
	return out.String() + errOut.String(), rc
}

// waitDomain waits until -N on n reports want ("UP" or "DOWN") and returns
// the report.
func (n *node) waitDomain(t *testing.T, want string) string {
	t.Helper()
	var out string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(PollInterval) {
		out, _ = n.ctl(t, "-N")
		if strings.Contains(out, "Domain State: "+want+"\n") {
			return out
		}
	}
	t.Fatalf("domain on %s never %s:\n%s", n.ip, want, out)
	return ""
}

// Three nodes connect; one going away shows as D on the others and takes the
// domain DOWN; dropping it from the node lists (SIGUSR1's Reload) brings the
// domain back UP with two nodes.
func TestDomainConnectivity(t *testing.T) {
	nodes := startNodes(t, "127.0.31.2", "127.0.31.3", "127.0.31.4")
	if out, rc := nodes[0].ctl(t, "-q"); rc != 0 || out != "READY\n" {
		t.Fatalf("-q = %q, %d", out, rc)
	}
	out := nodes[0].waitDomain(t, "UP")
	for _, want := range []string{"Node #0   - 127.0.31.2", "- READY", "Connected - Ready for operation", " Nodes From\\To   0   1   2\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("-N lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "  C") != 9 {
		t.Errorf("want a 3x3 table of C:\n%s", out)
	}

	nodes[2].stop()
	<-nodes[2].done
	out = nodes[0].waitDomain(t, "DOWN")
	t.Logf("nvidia-imex-ctl -N with a node gone:\n%s", out)
	if c := nodes[0].d.Connectivity(); c["127.0.31.4"] != StateDisconnected || c["127.0.31.3"] != StateConnected {
		t.Errorf("after node 2 stopped: %v\n%s", c, out)
	}
	if !strings.Contains(out, "127.0.31.4      - UNAVAILABLE") {
		t.Errorf("stopped node not UNAVAILABLE:\n%s", out)
	}

	for _, n := range nodes[:2] {
		writeNodes(t, n.nodesPath, "127.0.31.2", "127.0.31.3")
		if err := n.d.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	out = nodes[1].waitDomain(t, "UP")
	if strings.Contains(out, "127.0.31.4") {
		t.Errorf("removed node still listed:\n%s", out)
	}
}

// A peer that never came up is N, and its row I.
func TestNeverConnectedPeer(t *testing.T) {
	nodes := startNodes(t, "127.0.32.2")
	writeNodes(t, nodes[0].nodesPath, "127.0.32.2", "127.0.32.9")
	if err := nodes[0].d.Reload(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * PollInterval)
	out := nodes[0].waitDomain(t, "DOWN")
	if !strings.Contains(out, "   0    C   N\n") || !strings.Contains(out, "   1    I   I\n") {
		t.Errorf("want row 0 C N and row 1 I I:\n%s", out)
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	nodesPath := filepath.Join(dir, "nodes")
	writeNodes(t, nodesPath, "127.0.0.2")
	for name, tc := range map[string]struct{ cfg, want string }{
		"no bind ip":  {"SERVER_PORT=1\n", "IMEX_CMD_BIND_INTERFACE_IP is not set"},
		"bad port":    {"SERVER_PORT=x\nIMEX_CMD_BIND_INTERFACE_IP=127.0.0.2\n", `SERVER_PORT="x": want a port number`},
		"bad ip":      {"IMEX_CMD_BIND_INTERFACE_IP=node-1\n", `"node-1": want an IP address`},
		"daemonize":   {"DAEMONIZE=1\nIMEX_CMD_BIND_INTERFACE_IP=127.0.0.2\n", "runs in the foreground only"},
		"not kv":      {"SERVER_PORT\n", "want KEY=VALUE"},
		"not in list": {"IMEX_CMD_BIND_INTERFACE_IP=127.0.0.3\nIMEX_NODE_CONFIG_FILE=" + nodesPath + "\n", "does not have this node's address 127.0.0.3"},
		"name in list": {"IMEX_CMD_BIND_INTERFACE_IP=127.0.0.2\nIMEX_NODE_CONFIG_FILE=" + filepath.Join(dir, "names") + "\n",
			`"tray-1" is not an IP address`},
	} {
		t.Run(name, func(t *testing.T) {
			writeNodes(t, filepath.Join(dir, "names"), "tray-1")
			path := filepath.Join(t.TempDir(), "config.cfg")
			if err := os.WriteFile(path, []byte(tc.cfg), 0o644); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if rc := Main([]string{"nvidia-imex", "-c", path}, &out, &out); rc != 1 || !strings.Contains(out.String(), tc.want) {
				t.Errorf("nvidia-imex = %d, %q, want 1 and %q", rc, out.String(), tc.want)
			}
		})
	}
}

// The control command needs the command service and a running daemon.
func TestCtlErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.cfg")
	port := freePort(t, "127.0.33.2")
	for name, tc := range map[string]struct {
		cfg  string
		args []string
		rc   int
		want string
	}{
		"usage":       {"", []string{"-j"}, 2, "usage: nvidia-imex-ctl"},
		"cmd off":     {"IMEX_CMD_BIND_INTERFACE_IP=127.0.33.2\n", []string{"-q"}, 1, "IMEX_CMD_ENABLED is not 1"},
		"no daemon":   {fmt.Sprintf("IMEX_CMD_ENABLED=1\nIMEX_CMD_PORT=%d\nIMEX_CMD_BIND_INTERFACE_IP=127.0.33.2\n", port), []string{"-q"}, 1, "Connection to IMEX daemon failed"},
		"no config":   {"", []string{"-c", "/nonexistent", "-N"}, 1, "no such file"},
		"two queries": {"", []string{"-q", "-N"}, 2, "usage"},
	} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte(tc.cfg), 0o644); err != nil {
				t.Fatal(err)
			}
			args := tc.args
			if args[0] != "-c" {
				args = append([]string{"-c", path}, args...)
			}
			var out bytes.Buffer
			if rc := Main(append([]string{CtlName}, args...), &out, &out); rc != tc.rc || !strings.Contains(out.String(), tc.want) {
				t.Errorf("nvidia-imex-ctl %v = %d, %q, want %d and %q", args, rc, out.String(), tc.rc, tc.want)
			}
		})
	}
}
