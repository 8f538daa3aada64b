package sharing

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestMPSForgedPIDFile: the daemon's pid file lies in the pipe directory,
// which client containers see. A pid file that names another GPU's daemon
// (or any other process) must never make the plugin treat that process as
// this device's daemon: releasing the device stops its own daemon, not the
// one the file names.
func TestMPSForgedPIDFile(t *testing.T) {
	mt := newMPSTest(t, "dgxh100", MPSOptions{StopTimeout: 500 * time.Millisecond})
	victim, attacker := gpuRef(mt.sim, 1), gpuRef(mt.sim, 2)
	mt.acquire(t, victim, MPSShare{ID: "v"})
	mt.acquire(t, attacker, MPSShare{ID: "a"})
	victimPID, attackerPID := mt.pid(victim), mt.pid(attacker)
	if victimPID == 0 || attackerPID == 0 {
		t.Fatalf("daemons not running: %d %d", victimPID, attackerPID)
	}

	// The attacker's tenant rewrites its own device's pid file.
	forged := filepath.Join(mt.mgr.paths(attacker.UUID).pipe, pidFileName)
	if err := os.WriteFile(forged, []byte(strconv.Itoa(victimPID)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if pid, running, _ := mt.mgr.daemonStatus(mt.mgr.paths(attacker.UUID), 0); running {
		t.Errorf("the forged pid file makes process %d the attacker device's daemon", pid)
	}
	// Without the plugin's own record, there is no daemon to signal.
	if got := mt.pid(attacker); got != 0 {
		t.Errorf("pid file fallback accepted %d", got)
	}
	mt.release(t, attacker, "a")
	if !processRunning(victimPID) {
		t.Fatalf("releasing the attacker's device stopped the victim's daemon %d", victimPID)
	}
	if processRunning(attackerPID) {
		t.Errorf("the attacker device's own daemon %d still runs after its release", attackerPID)
	}
	mt.release(t, victim, "v")
	if processRunning(victimPID) {
		t.Errorf("the victim's daemon %d still runs after its release", victimPID)
	}
}
