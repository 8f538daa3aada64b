// Package imex runs the IMEX daemon of a compute domain on a node: it starts
// nvidia-imex when the domain's first claim is prepared on the node, keeps
// its peer list current, and stops it when the last claim is unprepared. A
// node runs one IMEX daemon (the driver serves one IMEX domain per node), so a
// node serves one domain at a time: a claim of a second domain is refused
// while the first has claims there. The daemon's files live in a directory
// per domain whose record (domain.json) survives a plugin restart, so
// Recover adopts a running daemon or stops one no claim holds.
//
// pkg/imexdomain drives it from the prepare path (docs/compute-domains.md).
package imex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/atomicfile"
)

// Config says how the node runs IMEX daemons.
type Config struct {
	// Binary is nvidia-imex (the driver root's, or cmd/imex-sim's under
	// simulation); Env is added to its environment.
	Binary string
	Env    []string
	// StateDir holds one directory per domain.
	StateDir string
	// NodeIP is the address this node's daemon serves its peers and the
	// command service on; ServerPort and CmdPort the ports.
	NodeIP              string
	ServerPort, CmdPort int
	// StopTimeout bounds how long Release waits for the daemon to exit
	// after SIGTERM before it kills it.
	StopTimeout time.Duration
}

// record is what survives a restart: the domain, the claims that hold its
// daemon on this node, and the daemon's PID.
type record struct {
	Domain string   `json:"domain"`
	Claims []string `json:"claims"`
	Peers  []string `json:"peers"`
	PID    int      `json:"pid"`
}

// Manager runs this node's IMEX daemon. It is safe for concurrent use.
type Manager struct {
	cfg Config

	mu     sync.Mutex
	active *record // nil: no daemon
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd's process exited; nil for an adopted one
}

// NewManager returns a manager with no daemon; call Recover before use after
// a restart.
func NewManager(cfg Config) *Manager {
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = 5 * time.Second
	}
	return &Manager{cfg: cfg}
}

func (m *Manager) dir(domain string) string { return filepath.Join(m.cfg.StateDir, domain) }

// ConfigPath is the config file of the domain's daemon, for nvidia-imex-ctl
// -c.
func (m *Manager) ConfigPath(domain string) string { return filepath.Join(m.dir(domain), "config.cfg") }

// Peers returns the peers the active daemon was last given.
func (m *Manager) Peers() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.active == nil {
		return nil
	}
	return slices.Clone(m.active.Peers)
}

// Acquire records that claim of domain is prepared on this node, starting
// the domain's daemon with peers (the addresses of the domain's nodes, this
// node's among them) if it is the first. It is idempotent. It refuses a claim
// of another domain while a domain has claims here.
func (m *Manager) Acquire(ctx context.Context, domain, claim string, peers []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.active != nil && m.active.Domain != domain {
		return fmt.Errorf("compute domain %s: this node's IMEX daemon serves compute domain %s (claims %s); a node serves one domain at a time",
			domain, m.active.Domain, strings.Join(m.active.Claims, ", "))
	}
	if m.active == nil {
		// Recorded before the daemon starts, so that a crash in between
		// leaves a record for Recover, which finds the daemon by its
		// command line.
		m.active = &record{Domain: domain, Claims: []string{claim}, Peers: slices.Clone(peers)}
		if err := os.MkdirAll(m.dir(domain), 0o755); err != nil {
			m.active = nil
			return fmt.Errorf("compute domain %s: %w", domain, err)
		}
		if err := m.save(); err != nil {
			m.active = nil
			return err
		}
		if err := m.start(ctx, m.active, peers); err != nil {
			m.active = nil
			return errors.Join(err, os.RemoveAll(m.dir(domain)))
		}
	}
	if !slices.Contains(m.active.Claims, claim) {
		m.active.Claims = append(m.active.Claims, claim)
		sort.Strings(m.active.Claims)
	}
	return m.save()
}

// Release records that claim is unprepared, stopping the daemon when it was
// the domain's last claim here. Releasing a claim not held is a no-op.
func (m *Manager) Release(ctx context.Context, domain, claim string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.active == nil || m.active.Domain != domain || !slices.Contains(m.active.Claims, claim) {
		return nil
	}
	m.active.Claims = slices.DeleteFunc(m.active.Claims, func(c string) bool { return c == claim })
	if len(m.active.Claims) > 0 {
		return m.save()
	}
	if err := m.stop(ctx); err != nil {
		return err
	}
	if err := os.RemoveAll(m.dir(domain)); err != nil {
		return fmt.Errorf("compute domain %s: remove daemon files: %w", domain, err)
	}
	m.active, m.cmd, m.exited = nil, nil, nil
	return nil
}

// SetPeers rewrites the daemon's node list and makes it re-read it
// (SIGUSR1), as nodes join and leave the domain.
func (m *Manager) SetPeers(ctx context.Context, domain string, peers []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.active == nil || m.active.Domain != domain {
		return fmt.Errorf("compute domain %s: no IMEX daemon for it on this node", domain)
	}
	if err := m.writeNodes(domain, peers); err != nil {
		return err
	}
	m.active.Peers = slices.Clone(peers)
	if err := m.save(); err != nil {
		return err
	}
	if err := syscall.Kill(m.active.PID, syscall.SIGUSR1); err != nil {
		return fmt.Errorf("compute domain %s: signal IMEX daemon %d to re-read its peers: %w", domain, m.active.PID, err)
	}
	klog.FromContext(ctx).V(2).Info("IMEX daemon peers updated", "domain", domain, "peers", peers)
	return nil
}

// Active returns the domain this node's daemon serves and the claims that
// hold it; "" when there is none.
func (m *Manager) Active() (string, []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.active == nil {
		return "", nil
	}
	return m.active.Domain, slices.Clone(m.active.Claims)
}

// PID returns the daemon's process ID, 0 when there is none.
func (m *Manager) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.active == nil {
		return 0
	}
	return m.active.PID
}

func (m *Manager) writeNodes(domain string, peers []string) error {
	if !slices.Contains(peers, m.cfg.NodeIP) {
		return fmt.Errorf("compute domain %s: peers %v do not include this node's address %s", domain, peers, m.cfg.NodeIP)
	}
	path := filepath.Join(m.dir(domain), "nodes_config.cfg")
	if err := atomicfile.WriteFile(path, []byte(strings.Join(peers, "\n")+"\n"), 0o644); err != nil {
		return fmt.Errorf("compute domain %s: write node list: %w", domain, err)
	}
	return nil
}

// save writes the active record. m.mu held.
func (m *Manager) save() error {
	data, err := json.Marshal(m.active)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(m.dir(m.active.Domain), "domain.json"), data, 0o644); err != nil {
		return fmt.Errorf("compute domain %s: record daemon: %w", m.active.Domain, err)
	}
	return nil
}

// readRecords reads every domain directory's record.
func (m *Manager) readRecords() ([]*record, error) {
	entries, err := os.ReadDir(m.cfg.StateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*record
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(m.cfg.StateDir, e.Name(), "domain.json"))
		rec := &record{Domain: e.Name()}
		if err == nil {
			err = json.Unmarshal(data, rec)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("compute domain %s: read daemon record: %w", e.Name(), err)
		}
		out = append(out, rec)
	}
	return out, nil
}
