package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kubelet is a local cluster's kubelet process, as hack/cluster/up.sh
// started it: its PID file in the node's directory, its log in the state
// dir's logs/<node>/, and it runs in the node's namespaces (pids/ns.pid).
type kubelet struct {
	node                 string
	args, environ        []string
	pidFile, logFile     string
	stoppedAt, startedAt time.Time
}

// stopKubelet stops the kubelet (SIGTERM, then SIGKILL after a minute) and
// remembers how to start it again; a cleanup starts it if the test does not.
// Containers keep running without it, as on a node whose kubelet is stopped.
func stopKubelet(t *testing.T, ctx context.Context) *kubelet {
	t.Helper()
	return stopKubeletOn(t, ctx, env.node)
}

// stopKubeletOn stops node's kubelet, as stopKubelet does env.node's.
func stopKubeletOn(t *testing.T, ctx context.Context, node string) *kubelet {
	t.Helper()
	dir := nodeDir(t, node)
	k := &kubelet{node: node, pidFile: filepath.Join(dir, "pids", "kubelet.pid"), logFile: filepath.Join(env.stateDir, "logs", node, "kubelet.log")}
	data, err := os.ReadFile(k.pidFile)
	if err != nil {
		t.Skipf("needs the local cluster's kubelet (hack/cluster/up.sh): %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("%s: %v", k.pidFile, err)
	}
	k.args = procStrings(t, pid, "cmdline")
	k.environ = procStrings(t, pid, "environ")
	if len(k.args) == 0 || filepath.Base(k.args[0]) != "kubelet" {
		t.Fatalf("PID %d of %s runs %q, not the kubelet", pid, k.pidFile, k.args)
	}
	// Started again in the node's namespaces, where its paths resolve.
	k.args = inNode(t, node, k.args...)
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("stop the kubelet (PID %d): %v", pid, err)
	}
	k.stoppedAt = time.Now()
	t.Cleanup(func() { k.start(t, context.Background()) })
	deadline := time.Now().Add(time.Minute)
	for processRuns(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("kubelet (PID %d) stopped", pid)
	return k
}

// start starts the kubelet again with its command line and environment,
// appending to its log, records its PID for hack/cluster/down.sh and waits
// until the node is Ready. A second call does nothing.
func (k *kubelet) start(t *testing.T, ctx context.Context) {
	t.Helper()
	if !k.startedAt.IsZero() {
		return
	}
	log, err := os.OpenFile(k.logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = log.Close() }()
	cmd := exec.Command(k.args[0], k.args[1:]...)
	cmd.Env, cmd.Stdout, cmd.Stderr = k.environ, log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the kubelet again: %v", err)
	}
	k.startedAt = time.Now()
	go func() { _ = cmd.Wait() }() // reaped while the test runs; init's afterwards
	if err := os.WriteFile(k.pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		t.Errorf("record the kubelet's PID for down.sh: %v", err)
	}
	t.Logf("kubelet started again (PID %d) after %s", cmd.Process.Pid, k.startedAt.Sub(k.stoppedAt).Round(time.Second))
	// Up: it renewed its node Lease (every 10 s) and the node is Ready.
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		lease, err := env.cluster.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, k.node, metav1.GetOptions{})
		if err != nil || lease.Spec.RenewTime == nil || !lease.Spec.RenewTime.After(k.startedAt) {
			return false, nil
		}
		n, err := env.cluster.Client.CoreV1().Nodes().Get(ctx, k.node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("node %s not Ready after the kubelet's restart: %v", k.node, err)
	}
}

// procStrings reads a NUL-separated /proc/PID file.
func procStrings(t *testing.T, pid int, name string) []string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, name))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range bytes.Split(bytes.TrimRight(data, "\x00"), []byte{0}) {
		out = append(out, string(f))
	}
	return out
}

// processRuns reports whether pid exists and is not a zombie.
func processRuns(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, os.ErrNotExist) || err != nil {
		return false
	}
	// pid (comm) STATE ...: comm may hold spaces, the state follows the last ')'.
	rest := string(data[bytes.LastIndexByte(data, ')')+1:])
	return !strings.HasPrefix(strings.TrimSpace(rest), "Z")
}
