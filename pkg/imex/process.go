package imex

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// start writes the domain's config and node list and starts its daemon.
// m.mu held.
func (m *Manager) start(ctx context.Context, rec *record, peers []string) error {
	dir := m.dir(rec.Domain)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("compute domain %s: %w", rec.Domain, err)
	}
	if err := m.writeNodes(rec.Domain, peers); err != nil {
		return err
	}
	cfgPath := filepath.Join(dir, "config.cfg")
	cfg := fmt.Sprintf("SERVER_PORT=%d\nIMEX_CMD_PORT=%d\nIMEX_CMD_ENABLED=1\nIMEX_CMD_BIND_INTERFACE_IP=%s\nIMEX_NODE_CONFIG_FILE=%s\nDAEMONIZE=0\n",
		m.cfg.ServerPort, m.cfg.CmdPort, m.cfg.NodeIP, filepath.Join(dir, "nodes_config.cfg"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("compute domain %s: write IMEX config: %w", rec.Domain, err)
	}
	log, err := os.OpenFile(filepath.Join(dir, "imex.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("compute domain %s: %w", rec.Domain, err)
	}
	defer log.Close()
	cmd := exec.Command(m.cfg.Binary, "-c", cfgPath)
	cmd.Env = append(os.Environ(), m.cfg.Env...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: the daemon outlives a plugin restart, and the
	// plugin's signals do not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("compute domain %s: start IMEX daemon %s: %w", rec.Domain, m.cfg.Binary, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	rec.PID, rec.Peers = cmd.Process.Pid, slices.Clone(peers)
	m.cmd, m.exited = cmd, exited
	klog.FromContext(ctx).Info("Started IMEX daemon", "domain", rec.Domain, "pid", rec.PID, "peers", peers)
	return nil
}

// stop ends the active daemon: SIGTERM, then SIGKILL after StopTimeout.
// m.mu held.
func (m *Manager) stop(ctx context.Context) error {
	pid := m.active.PID
	if pid <= 0 || !alive(pid) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("compute domain %s: stop IMEX daemon %d: %w", m.active.Domain, pid, err)
	}
	if !m.waitExit(pid, m.cfg.StopTimeout) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		if !m.waitExit(pid, m.cfg.StopTimeout) {
			return fmt.Errorf("compute domain %s: IMEX daemon %d did not exit after SIGKILL", m.active.Domain, pid)
		}
	}
	klog.FromContext(ctx).Info("Stopped IMEX daemon", "domain", m.active.Domain, "pid", pid)
	return nil
}

// waitExit waits up to timeout for pid to exit: through Wait for a daemon
// this process started, by polling for an adopted one.
func (m *Manager) waitExit(pid int, timeout time.Duration) bool {
	if m.exited != nil && m.cmd != nil && m.cmd.Process.Pid == pid {
		select {
		case <-m.exited:
			return true
		case <-time.After(timeout):
			return false
		}
	}
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if !alive(pid) {
			return true
		}
	}
	return false
}

// alive reports whether pid runs (a zombie counts as exited).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// isDaemon reports whether pid runs the daemon of the domain's config: its
// command line is exactly the one start gives it, so a reused PID is not
// taken for it, nor is nvidia-imex-ctl -c <the same config> -N (the
// status poller), whose command line names the config too.
func (m *Manager) isDaemon(pid int, domain string) bool {
	if !alive(pid) {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	want := strings.Join([]string{m.cfg.Binary, "-c", filepath.Join(m.dir(domain), "config.cfg")}, "\x00") + "\x00"
	return err == nil && string(cmdline) == want
}

// findDaemon returns the PID of a process running the domain's daemon,
// found by its command line, or 0. A crash between starting a daemon and
// recording its PID leaves a daemon only this finds.
func (m *Manager) findDaemon(domain string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && m.isDaemon(pid, domain) {
			return pid
		}
	}
	return 0
}

// Recover, after a restart, reconciles the daemons on disk with the claims
// the checkpoint holds (held: claim UIDs by domain). A domain with held
// claims keeps its daemon, adopted if it still runs and restarted with its
// recorded peers if not; the others' daemons are stopped and their files
// removed. More than one domain with held claims is an error: it cannot
// happen through Acquire.
func (m *Manager) Recover(ctx context.Context, held map[string][]string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	logger := klog.FromContext(ctx)
	recs, err := m.readRecords()
	if err != nil {
		return err
	}
	var keep []string
	for _, rec := range recs {
		claims := held[rec.Domain]
		if !m.isDaemon(rec.PID, rec.Domain) {
			rec.PID = m.findDaemon(rec.Domain)
		}
		running := rec.PID != 0
		if len(claims) == 0 {
			m.active, m.cmd, m.exited = rec, nil, nil
			if running {
				if err := m.stop(ctx); err != nil {
					return err
				}
			}
			m.active = nil
			if err := os.RemoveAll(m.dir(rec.Domain)); err != nil {
				return fmt.Errorf("compute domain %s: remove daemon files: %w", rec.Domain, err)
			}
			logger.Info("Removed the IMEX daemon of a domain no claim holds", "domain", rec.Domain, "wasRunning", running)
			continue
		}
		keep = append(keep, rec.Domain)
		if len(keep) > 1 {
			return fmt.Errorf("claims of compute domains %s hold this node's IMEX daemon; a node serves one domain at a time", strings.Join(keep, ", "))
		}
		rec.Claims = slices.Sorted(slices.Values(claims))
		if running {
			m.active, m.cmd, m.exited = rec, nil, nil
			logger.Info("Adopted the running IMEX daemon", "domain", rec.Domain, "pid", rec.PID)
		} else {
			if err := m.start(ctx, rec, rec.Peers); err != nil {
				return err
			}
			m.active = rec
		}
		if err := m.save(); err != nil {
			return err
		}
	}
	return nil
}
