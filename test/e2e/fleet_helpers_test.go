package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cordonOthers marks every node but env.node unschedulable (or
// schedulable again), so that the single-node tests see one node's devices
// on a cluster of several. DaemonSet pods tolerate it: the plugins keep
// running on every node.
func cordonOthers(cordon bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var others []string
	for _, n := range env.nodes {
		if n != env.node {
			others = append(others, n)
		}
	}
	return env.runner.SetUnschedulable(ctx, cordon, others...)
}

// useFleet makes every node schedulable for a test of several nodes and
// cordons the others again when it ends. It skips, saying why, on a cluster
// of fewer than min nodes with the driver.
func useFleet(t *testing.T, min int) []string {
	t.Helper()
	if len(env.nodes) < min {
		t.Skipf("needs %d nodes with the driver, the cluster has %d (%v): make e2e starts 3 besides the trays (GDD_NODES)", min, len(env.nodes), env.nodes)
	}
	if err := cordonOthers(false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cordonOthers(true); err != nil {
			t.Error(err)
		}
	})
	return env.nodes
}

// nodeDir is node's directory as the host sees it (hack/cluster/node.sh):
// kubelet/ (its root dir), cdi/ (its /var/run/cdi), pids/.
func nodeDir(t *testing.T, node string) string {
	t.Helper()
	d := filepath.Join(env.nodesDir, node)
	if _, err := os.Stat(d); err != nil {
		t.Skipf("needs the local cluster's node directories (hack/cluster/up.sh): %v", err)
	}
	return d
}

// inNode prefixes a command line with nsenter into node's mount, network,
// UTS and IPC namespaces (its holder's PID is pids/ns.pid), where the node's
// own mounts are, as hack/cluster/enter.sh does.
func inNode(t *testing.T, node string, args ...string) []string {
	t.Helper()
	pid, err := os.ReadFile(filepath.Join(nodeDir(t, node), "pids", "ns.pid"))
	if err != nil {
		t.Fatalf("the namespaces of node %s: %v", node, err)
	}
	return append([]string{"nsenter", "-t", strings.TrimSpace(string(pid)), "-m", "-n", "-u", "-i", "--"}, args...)
}

// nodeExec runs a command in node's namespaces (inNode).
func nodeExec(t *testing.T, ctx context.Context, node string, args ...string) (string, error) {
	t.Helper()
	argv := inNode(t, node, args...)
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	return string(out), err
}
