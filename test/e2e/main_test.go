// Package e2e runs the driver on a real cluster: the demo scenarios asserted in code,
// unprepare on pod deletion, plugin restarts, helm upgrades, the chart against the
// real API server, and the admission policy that keeps a node's plugin to its own
// node's ResourceSlices.
//
// The tests need a cluster with the chart installed with simulated GPUs, on this
// machine (they read the plugin's files on the node): `make e2e` brings one up,
// installs the chart, runs them and tears it down. Without E2E=1 (or
// E2E_KUBECONFIG) they are skipped.
//
// Settings (environment): E2E_KUBECONFIG (default $KUBECONFIG, else
// /tmp/gdd/kubeconfig/admin.kubeconfig), E2E_RELEASE and E2E_NAMESPACE
// (gpu-dra-driver), E2E_KUBELET_DIR (/tmp/gdd/kubelet), E2E_SIMULATE (dgxh100),
// E2E_CDI_DIR (/var/run/cdi), HELM (helm from PATH), E2E_KUBECTL_GPU (bin/kubectl-gpu;
// make build), E2E_HEALTH_RECOVERY_WINDOW (the chart's kubeletPlugin.health.recoveryWindow,
// 30s in make e2e).
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const driverName = vocabulary.DriverName

// env is the cluster under test.
var env struct {
	cluster                  *scenarios.Cluster
	runner                   *scenarios.Runner
	release, namespace       string
	kubeletDir, simulate     string
	cdiDir, helm, repoRoot   string
	node                     string   // the node single-node tests use (E2E_NODE)
	nodes                    []string // every node with the driver's slices but the trays
	trays                    []string // the GB200 trays for compute domains, tainted trayTaint
	trayTaint                string   // E2E_TRAY_TAINT, key=value:effect (hack/demo/lib.sh DEMO_TRAY_TAINT)
	nodesDir, stateDir       string   // the local cluster's host view of the nodes, its state dir
	nodeLocal                string   // where each node sees its own directory ("": not the local cluster)
	pluginSA                 string
	pluginDataDir, stateFile string
	recoveryWindow           time.Duration
}

func TestMain(m *testing.M) {
	if os.Getenv("E2E") != "1" && os.Getenv("E2E_KUBECONFIG") == "" {
		fmt.Println("test/e2e: skipped: needs a cluster with the chart installed; run `make e2e`, or set E2E=1 (or E2E_KUBECONFIG) against a running local cluster")
		os.Exit(0)
	}
	if err := setup(); err != nil {
		fmt.Fprintln(os.Stderr, "test/e2e:", err)
		os.Exit(1)
	}
	// Single-node tests count on their node's devices alone: the other nodes
	// are cordoned except while a fleet test runs (useFleet).
	if err := cordonOthers(true); err != nil {
		fmt.Fprintln(os.Stderr, "test/e2e:", err)
		os.Exit(1)
	}
	rc := m.Run()
	if err := cordonOthers(false); err != nil {
		fmt.Fprintln(os.Stderr, "test/e2e:", err)
		rc = 1
	}
	os.Exit(rc)
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func setup() error {
	_, file, _, _ := runtime.Caller(0)
	env.repoRoot = filepath.Join(filepath.Dir(file), "..", "..")
	env.release = getenv("E2E_RELEASE", "gpu-dra-driver")
	env.namespace = getenv("E2E_NAMESPACE", "gpu-dra-driver")
	env.stateDir = getenv("E2E_STATE_DIR", "/tmp/gdd")
	env.nodesDir = filepath.Join(env.stateDir, "nodes")
	env.node = os.Getenv("E2E_NODE")
	if env.node != "" {
		// The local cluster: the node's files as the host sees them (hack/cluster/node.sh).
		env.nodeLocal = filepath.Join(env.stateDir, "node")
		env.kubeletDir = getenv("E2E_KUBELET_DIR", filepath.Join(env.nodesDir, env.node, "kubelet"))
		env.cdiDir = getenv("E2E_CDI_DIR", filepath.Join(env.nodesDir, env.node, "cdi"))
	} else {
		env.kubeletDir = getenv("E2E_KUBELET_DIR", "/tmp/gdd/kubelet")
		env.cdiDir = getenv("E2E_CDI_DIR", "/var/run/cdi")
	}
	env.simulate = getenv("E2E_SIMULATE", "dgxh100")
	env.helm = getenv("HELM", "helm")
	env.pluginDataDir = filepath.Join(env.kubeletDir, "plugins", driverName)
	env.stateFile = filepath.Join(env.pluginDataDir, "simulated-"+env.simulate, "nvml-state.json")

	c, err := scenarios.Connect(os.Getenv("E2E_KUBECONFIG"))
	if err != nil {
		return err
	}
	env.cluster = c
	env.runner = scenarios.NewRunner(c)
	env.runner.Driver = driverName
	env.runner.Timeout = 2 * time.Minute
	env.runner.KubectlGPUPath = getenv("E2E_KUBECTL_GPU", filepath.Join(env.repoRoot, "bin", "kubectl-gpu"))
	if env.recoveryWindow, err = time.ParseDuration(getenv("E2E_HEALTH_RECOVERY_WINDOW", "30s")); err != nil {
		return fmt.Errorf("E2E_HEALTH_RECOVERY_WINDOW: %w", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		slices, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + driverName})
		if err == nil && len(slices.Items) > 0 {
			// Channel slices of compute domains have a node selector, no node.
			seen := map[string]bool{}
			for _, s := range slices.Items {
				if n := s.Spec.NodeName; n != nil && !seen[*n] {
					seen[*n] = true
					env.nodes = append(env.nodes, *n)
				}
			}
			sort.Strings(env.nodes)
			if env.node == "" {
				env.node = env.nodes[0]
			}
			if seen[env.node] {
				break
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no ResourceSlices of %s: is the chart installed (make e2e)? last error: %v", driverName, err)
		case <-time.After(time.Second):
		}
	}
	env.trayTaint = getenv("E2E_TRAY_TAINT", "demo.gpu.dra.dev/nvl72=true:NoSchedule")
	if err := splitTrays(ctx); err != nil {
		return err
	}
	dss, err := c.Client.AppsV1().DaemonSets(env.namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=kubelet-plugin"})
	if err != nil || len(dss.Items) == 0 {
		return fmt.Errorf("no kubelet plugin DaemonSet in namespace %s: %v", env.namespace, err)
	}
	env.pluginSA = dss.Items[0].Spec.Template.Spec.ServiceAccountName
	if _, err := os.Stat(env.stateFile); err != nil {
		return fmt.Errorf("the simulated machine's state is not readable here (the tests run on the node): %w", err)
	}
	return nil
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// splitTrays moves the nodes tainted env.trayTaint's key (the GB200 trays
// that hack/demo/lib.sh reserves for compute domains) from env.nodes to
// env.trays: the fleet tests use the other nodes.
func splitTrays(ctx context.Context) error {
	key, _, _ := strings.Cut(env.trayTaint, "=")
	var nodes []string
	for _, n := range env.nodes {
		node, err := env.cluster.Client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("node %s: %w", n, err)
		}
		tray := false
		for _, taint := range node.Spec.Taints {
			tray = tray || taint.Key == key
		}
		if tray && n != env.node {
			env.trays = append(env.trays, n)
		} else {
			nodes = append(nodes, n)
		}
	}
	env.nodes = nodes
	return nil
}
