package imex

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// envPlugin makes the test binary a plugin stand-in that acquires a domain's
// daemon, prints the daemon's PID and waits to be killed. Its value is the
// JSON of childArgs.
const envPlugin = "IMEX_TEST_RUN_AS_PLUGIN"

type childArgs struct {
	Config Config
	Domain string
	Claim  string
	Peers  []string
}

func pluginChild() int {
	var a childArgs
	if err := json.Unmarshal([]byte(os.Getenv(envPlugin)), &a); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	m := NewManager(a.Config)
	if err := m.Acquire(context.Background(), a.Domain, a.Claim, a.Peers); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(m.PID())
	select {} // until killed
}

// A plugin killed with SIGKILL leaves its domain's daemon running (it is in
// its own process group); the next plugin's Recover adopts it while the
// checkpoint holds the claim, and stops it once the claim is gone.
func TestCrashedPluginLeavesNoDaemon(t *testing.T) {
	ctx := context.Background()
	const a = "127.0.45.2"
	r := newRack(t, a)
	m := r.manager(a) // sets up the state dir and config
	args, err := json.Marshal(childArgs{Config: m.cfg, Domain: "d1", Claim: "claim-1", Peers: []string{a}})
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), envPlugin+"="+string(args))
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = child.Process.Kill()
		t.Fatalf("plugin child: %v", err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if !alive(pid) {
		t.Fatalf("daemon %d died with the plugin", pid)
	}

	adopted := r.manager(a)
	if err := adopted.Recover(ctx, map[string][]string{"d1": {"claim-1"}}); err != nil {
		t.Fatal(err)
	}
	if adopted.PID() != pid {
		t.Fatalf("adopted pid %d, want %d", adopted.PID(), pid)
	}
	r.waitDomain(a, "d1", "UP")
	if err := adopted.Release(ctx, "d1", "claim-1"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); alive(pid) && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
	if alive(pid) {
		t.Errorf("daemon %d runs after the last claim was released", pid)
	}
}
