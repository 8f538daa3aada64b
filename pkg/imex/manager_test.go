package imex

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/imexd"
)

// envDaemon makes the test binary the simulated nvidia-imex.
const envDaemon = "IMEX_TEST_RUN_AS_DAEMON"

func TestMain(m *testing.M) {
	if os.Getenv(envDaemon) == "1" {
		os.Exit(imexd.Main(append([]string{"nvidia-imex"}, os.Args[1:]...), os.Stdout, os.Stderr))
	}
	if os.Getenv(envPlugin) != "" {
		os.Exit(pluginChild())
	}
	os.Exit(m.Run())
}

func freePort(t *testing.T, ip string) int {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Skipf("cannot listen on %s: %v", ip, err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// rack is a set of simulated nodes' managers sharing ports.
type rack struct {
	t                   *testing.T
	serverPort, cmdPort int
	dirs                map[string]string
}

func newRack(t *testing.T, ip string) *rack {
	return &rack{t: t, serverPort: freePort(t, ip), cmdPort: freePort(t, ip), dirs: map[string]string{}}
}

// manager returns a new manager for node ip over its state directory, as
// after a plugin restart when called again.
func (r *rack) manager(ip string) *Manager {
	if r.dirs[ip] == "" {
		r.dirs[ip] = r.t.TempDir()
	}
	m := NewManager(Config{
		Binary: os.Args[0], Env: []string{envDaemon + "=1"}, StateDir: r.dirs[ip],
		NodeIP: ip, ServerPort: r.serverPort, CmdPort: r.cmdPort, StopTimeout: 2 * time.Second,
	})
	r.t.Cleanup(func() {
		if d, claims := m.Active(); d != "" {
			for _, c := range claims {
				_ = m.Release(context.Background(), d, c)
			}
		}
	})
	return m
}

// waitDomain waits until node ip's daemon for domain reports want.
func (r *rack) waitDomain(ip, domain, want string) string {
	r.t.Helper()
	cfg := filepath.Join(r.dirs[ip], domain, "config.cfg")
	var out bytes.Buffer
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		out.Reset()
		imexd.Main([]string{imexd.CtlName, "-c", cfg, "-N"}, &out, &out)
		if strings.Contains(out.String(), "Domain State: "+want) {
			return out.String()
		}
	}
	r.t.Fatalf("%s: domain %s never %s:\n%s", ip, domain, want, out.String())
	return ""
}

func TestDaemonLifecycle(t *testing.T) {
	ctx := context.Background()
	const a, b, c = "127.0.41.2", "127.0.41.3", "127.0.41.4"
	r := newRack(t, a)
	ma, mb := r.manager(a), r.manager(b)

	if err := ma.Acquire(ctx, "d1", "claim-1", []string{a, b}); err != nil {
		t.Fatal(err)
	}
	pid := ma.PID()
	if err := ma.Acquire(ctx, "d1", "claim-2", []string{a, b}); err != nil || ma.PID() != pid {
		t.Fatalf("second claim: %v, pid %d then %d: want the same daemon", err, pid, ma.PID())
	}
	if err := ma.Acquire(ctx, "d1", "claim-2", []string{a, b}); err != nil {
		t.Fatalf("Acquire again: %v", err)
	}
	if err := mb.Acquire(ctx, "d1", "claim-3", []string{a, b}); err != nil {
		t.Fatal(err)
	}
	r.waitDomain(a, "d1", "UP")

	// One daemon per node: another domain is refused while d1 has claims.
	err := ma.Acquire(ctx, "d2", "claim-9", []string{a})
	if err == nil || !strings.Contains(err.Error(), "serves compute domain d1 (claims claim-1, claim-2)") {
		t.Fatalf("Acquire of d2 = %v, want a refusal naming d1", err)
	}

	// A third node joins: the others' peer lists follow.
	mc := r.manager(c)
	if err := mc.Acquire(ctx, "d1", "claim-4", []string{a, b, c}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Manager{ma, mb} {
		if err := m.SetPeers(ctx, "d1", []string{a, b, c}); err != nil {
			t.Fatal(err)
		}
	}
	if out := r.waitDomain(a, "d1", "UP"); !strings.Contains(out, c) {
		t.Errorf("third node not in the domain:\n%s", out)
	}

	// The daemon stays while a claim holds it and goes with the last.
	if err := ma.Release(ctx, "d1", "claim-1"); err != nil || !alive(pid) {
		t.Fatalf("after the first release: %v, daemon alive %v", err, alive(pid))
	}
	if err := ma.Release(ctx, "d1", "claim-2"); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Errorf("daemon %d still runs after the last claim", pid)
	}
	if _, err := os.Stat(filepath.Join(r.dirs[a], "d1")); !os.IsNotExist(err) {
		t.Errorf("domain files left: %v", err)
	}
	if err := ma.Release(ctx, "d1", "claim-2"); err != nil {
		t.Errorf("Release again: %v", err)
	}
	r.waitDomain(b, "d1", "DOWN")
	// Now the node is free for another domain.
	if err := ma.Acquire(ctx, "d2", "claim-9", []string{a}); err != nil {
		t.Fatalf("d2 after d1 left: %v", err)
	}
}

func TestSetPeersRefusesListWithoutNode(t *testing.T) {
	ctx := context.Background()
	r := newRack(t, "127.0.42.2")
	m := r.manager("127.0.42.2")
	if err := m.Acquire(ctx, "d", "c", []string{"127.0.42.3"}); err == nil || !strings.Contains(err.Error(), "do not include this node's address 127.0.42.2") {
		t.Fatalf("Acquire = %v", err)
	}
	if err := m.SetPeers(ctx, "d", []string{"127.0.42.2"}); err == nil || !strings.Contains(err.Error(), "no IMEX daemon") {
		t.Fatalf("SetPeers without daemon = %v", err)
	}
}

// After a plugin restart, Recover adopts the daemon of a domain the
// checkpoint still holds, restarts it if it died meanwhile, and stops and
// removes one no claim holds.
func TestRecover(t *testing.T) {
	ctx := context.Background()
	const a = "127.0.43.2"
	r := newRack(t, a)
	before := r.manager(a)
	if err := before.Acquire(ctx, "d1", "claim-1", []string{a}); err != nil {
		t.Fatal(err)
	}
	pid := before.PID()

	adopted := r.manager(a)
	if err := adopted.Recover(ctx, map[string][]string{"d1": {"claim-1"}}); err != nil {
		t.Fatal(err)
	}
	if adopted.PID() != pid {
		t.Fatalf("adopted pid %d, want %d", adopted.PID(), pid)
	}
	r.waitDomain(a, "d1", "UP")

	// The daemon dies while the plugin is down: Recover starts a new one.
	if err := before.stopForTest(); err != nil {
		t.Fatal(err)
	}
	restarted := r.manager(a)
	if err := restarted.Recover(ctx, map[string][]string{"d1": {"claim-1"}}); err != nil {
		t.Fatal(err)
	}
	if restarted.PID() == pid || !alive(restarted.PID()) {
		t.Fatalf("after the daemon died: pid %d (was %d)", restarted.PID(), pid)
	}
	r.waitDomain(a, "d1", "UP")
	newPID := restarted.PID()

	// The claim was unprepared while the plugin was down: nothing holds d1.
	cleaned := r.manager(a)
	if err := cleaned.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if alive(newPID) {
		t.Errorf("daemon %d of an unheld domain still runs", newPID)
	}
	if d, _ := cleaned.Active(); d != "" {
		t.Errorf("active domain %q after recovering with no claims", d)
	}
	if entries, _ := os.ReadDir(r.dirs[a]); len(entries) != 0 {
		t.Errorf("state left: %v", entries)
	}
}

// stopForTest kills the daemon as a crash would, without touching the
// record.
func (m *Manager) stopForTest() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stop(context.Background())
}

// A crash between starting the daemon and recording its PID leaves a record
// without it: Recover still finds the daemon (by its command line) and stops
// it when no claim holds the domain.
func TestRecoverFindsUnrecordedDaemon(t *testing.T) {
	ctx := context.Background()
	const a = "127.0.44.2"
	r := newRack(t, a)
	before := r.manager(a)
	if err := before.Acquire(ctx, "d1", "claim-1", []string{a}); err != nil {
		t.Fatal(err)
	}
	pid := before.PID()
	path := filepath.Join(r.dirs[a], "d1", "domain.json")
	if err := os.WriteFile(path, []byte(`{"domain":"d1","claims":["claim-1"],"peers":["`+a+`"],"pid":0}`), 0o644); err != nil {
		t.Fatal(err)
	}
	after := r.manager(a)
	if err := after.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Errorf("daemon %d leaked: its PID was not recorded", pid)
	}
}

// TestIsDaemonIgnoresCtl: a process whose command line names the domain's
// config but is not the daemon (the status poller's nvidia-imex-ctl -c
// <config> -N) is not taken for the daemon at recovery.
func TestIsDaemonIgnoresCtl(t *testing.T) {
	const a = "127.0.44.3"
	r := newRack(t, a)
	m := r.manager(a)
	cfg := filepath.Join(r.dirs[a], "d1", "config.cfg")
	ctl := exec.Command("sh", "-c", "sleep 30", imexd.CtlName, "-c", cfg, "-N")
	if err := ctl.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ctl.Process.Kill(); _ = ctl.Wait() }()
	if m.isDaemon(ctl.Process.Pid, "d1") {
		t.Errorf("pid %d (%s) taken for the daemon of d1", ctl.Process.Pid, strings.Join(ctl.Args, " "))
	}
	if pid := m.findDaemon("d1"); pid != 0 {
		t.Errorf("findDaemon(d1) = %d, want 0: no daemon runs", pid)
	}
}
