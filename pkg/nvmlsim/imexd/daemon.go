package imexd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Peer connection states, the letters of nvidia-imex-ctl -N's connectivity
// table.
const (
	StateConnected      = "C"
	StateNeverConnected = "N"
	StateDisconnected   = "D"
	StateInvalid        = "I"
)

// PollInterval is how often a daemon dials its peers.
const PollInterval = 100 * time.Millisecond

// dialTimeout bounds one dial of a peer.
const dialTimeout = 200 * time.Millisecond

// Daemon is one simulated nvidia-imex daemon.
type Daemon struct {
	cfg *Config

	mu    sync.Mutex
	nodes []string
	// state[peer] is this daemon's connection to peer; views[peer] the
	// peer's own row (its states by address) as it last reported it.
	state map[string]string
	views map[string]map[string]string
}

// NewDaemon reads cfg's node list; the node's own address must be in it.
func NewDaemon(cfg *Config) (*Daemon, error) {
	d := &Daemon{cfg: cfg, state: map[string]string{}, views: map[string]map[string]string{}}
	if err := d.Reload(); err != nil {
		return nil, err
	}
	return d, nil
}

// Reload re-reads the node list (SIGUSR1): new peers start as never
// connected, removed ones are forgotten.
func (d *Daemon) Reload() error {
	nodes, err := ReadNodes(d.cfg.NodeConfigFile)
	if err != nil {
		return fmt.Errorf("read node list: %w", err)
	}
	if !slices.Contains(nodes, d.cfg.BindIP) {
		return fmt.Errorf("node list %s does not have this node's address %s", d.cfg.NodeConfigFile, d.cfg.BindIP)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nodes = nodes
	for peer := range d.state {
		if !slices.Contains(nodes, peer) {
			delete(d.state, peer)
			delete(d.views, peer)
		}
	}
	for _, n := range nodes {
		if _, ok := d.state[n]; !ok {
			d.state[n] = StateNeverConnected
		}
	}
	d.state[d.cfg.BindIP] = StateConnected
	return nil
}

// Run serves peers on BindIP:SERVER_PORT and, when IMEX_CMD_ENABLED, the
// control command on BindIP:IMEX_CMD_PORT, and dials the peers every
// PollInterval, until ctx ends. ready, if not nil, is called once it serves.
func (d *Daemon) Run(ctx context.Context, ready func()) error {
	peerLn, err := net.Listen("tcp", net.JoinHostPort(d.cfg.BindIP, strconv.Itoa(d.cfg.ServerPort)))
	if err != nil {
		return fmt.Errorf("serve peers: %w", err)
	}
	defer peerLn.Close()
	go d.serve(peerLn, func(conn net.Conn) { fmt.Fprintln(conn, d.row()) })
	if d.cfg.CmdEnabled {
		cmdLn, err := net.Listen("tcp", net.JoinHostPort(d.cfg.BindIP, strconv.Itoa(d.cfg.CmdPort)))
		if err != nil {
			return fmt.Errorf("serve commands: %w", err)
		}
		defer cmdLn.Close()
		go d.serve(cmdLn, d.command)
	}
	if ready != nil {
		ready()
	}
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		d.poll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (d *Daemon) serve(ln net.Listener, handle func(net.Conn)) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return // closed
		}
		go func() {
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(time.Second))
			handle(conn)
		}()
	}
}

// row is this daemon's connectivity row, "addr=state ..." in node order.
func (d *Daemon) row() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	parts := make([]string, 0, len(d.nodes))
	for _, n := range d.nodes {
		parts = append(parts, n+"="+d.state[n])
	}
	return strings.Join(parts, " ")
}

// poll dials every peer and records its state and its row.
func (d *Daemon) poll(ctx context.Context) {
	d.mu.Lock()
	peers := slices.DeleteFunc(slices.Clone(d.nodes), func(n string) bool { return n == d.cfg.BindIP })
	d.mu.Unlock()
	for _, peer := range peers {
		view, err := d.dial(ctx, peer)
		d.mu.Lock()
		if _, still := d.state[peer]; still {
			switch {
			case err == nil:
				d.state[peer], d.views[peer] = StateConnected, view
			case d.state[peer] == StateConnected:
				d.state[peer] = StateDisconnected
				delete(d.views, peer)
			}
		}
		d.mu.Unlock()
	}
}

func (d *Daemon) dial(ctx context.Context, peer string) (map[string]string, error) {
	dialer := net.Dialer{Timeout: dialTimeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(d.cfg.BindIP)}}
	conn, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(peer, strconv.Itoa(d.cfg.ServerPort)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(dialTimeout))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return nil, err
	}
	view := map[string]string{}
	for _, f := range strings.Fields(line) {
		addr, state, ok := strings.Cut(f, "=")
		if !ok {
			return nil, errors.New("malformed peer row")
		}
		view[addr] = state
	}
	return view, nil
}

// command answers one control command: "q" or "N".
func (d *Daemon) command(conn net.Conn) {
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return
	}
	switch strings.TrimSpace(line) {
	case "q":
		fmt.Fprintln(conn, "READY")
	case "N":
		fmt.Fprint(conn, d.domainStatus())
	default:
		fmt.Fprintln(conn, "unknown command")
	}
}

// Connectivity returns this daemon's state of each node of its list, by
// address (its own is C).
func (d *Daemon) Connectivity() map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]string, len(d.state))
	for k, v := range d.state {
		out[k] = v
	}
	return out
}
