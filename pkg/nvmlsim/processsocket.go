package nvmlsim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/loadsim"
)

// ProcessSocket is where, below a simulated driver root, simulated processes register
// (loadsim.ProcessSocket).
const ProcessSocket = loadsim.ProcessSocket

// registrationTimeout bounds how long a connection may take to send its registration.
const registrationTimeout = 10 * time.Second

// maxRegistration bounds a registration line.
const maxRegistration = 64 << 10

// ServeProcesses listens on the unix socket path (replacing a stale one) for simulated processes
// until ctx is canceled. It returns once it listens.
func (m *Machine) ServeProcesses(ctx context.Context, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("simulated process socket: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("simulated process socket: remove stale %s: %w", path, err)
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "unix", path)
	if err != nil {
		return fmt.Errorf("simulated process socket: %w", err)
	}
	// Containers of any user may register, as any user may open /dev/nvidia*.
	if err := os.Chmod(path, 0o666); err != nil {
		_ = l.Close()
		return fmt.Errorf("simulated process socket: %w", err)
	}
	logger := klog.FromContext(ctx).WithValues("socket", path)
	go func() {
		<-ctx.Done()
		_ = l.Close()
	}()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				if ctx.Err() == nil {
					logger.Error(err, "Simulated process socket stopped accepting")
				}
				return
			}
			go m.serveProcess(ctx, conn.(*net.UnixConn))
		}
	}()
	return nil
}

// serveProcess registers the process behind conn until conn closes or ctx ends.
func (m *Machine) serveProcess(ctx context.Context, conn *net.UnixConn) {
	defer func() { _ = conn.Close() }()
	logger := klog.FromContext(ctx)
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	pid, err := peerPID(conn)
	if err != nil {
		logger.Error(err, "Simulated process without peer credentials")
		return
	}
	_ = conn.SetReadDeadline(time.Now().Add(registrationTimeout))
	r := bufio.NewReader(&limitedConn{conn: conn, left: maxRegistration})
	line, err := r.ReadBytes('\n')
	if err != nil {
		logger.V(2).Info("Simulated process sent no registration", "pid", pid, "err", err)
		return
	}
	var reg Registration
	unregister, err := func() (func(), error) {
		if err := json.Unmarshal(line, &reg); err != nil {
			return nil, fmt.Errorf("registration of process %d: %w", pid, err)
		}
		return m.RegisterProcess(pid, reg)
	}()
	if err != nil {
		_, _ = fmt.Fprintf(conn, "error: %v\n", err)
		logger.V(2).Info("Refused simulated process", "pid", pid, "err", err)
		return
	}
	defer unregister()
	logger.V(4).Info("Simulated process registered", "pid", pid, "devices", reg.Devices, "smPercent", reg.SMPercent, "memoryBytes", reg.MemoryBytes, "mps", reg.MPS)
	if _, err := fmt.Fprintln(conn, "ok"); err != nil {
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	// Anything more the process sends is ignored; EOF or an error means it is gone.
	var buf [512]byte
	for {
		if _, err := conn.Read(buf[:]); err != nil {
			logger.V(4).Info("Simulated process unregistered", "pid", pid)
			return
		}
	}
}

// limitedConn reads at most left bytes from conn.
type limitedConn struct {
	conn *net.UnixConn
	left int
}

func (c *limitedConn) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, fmt.Errorf("registration longer than %d bytes", maxRegistration)
	}
	if len(p) > c.left {
		p = p[:c.left]
	}
	n, err := c.conn.Read(p)
	c.left -= n
	return n, err
}

// peerPID is the PID of the process at the other end of conn.
func peerPID(conn *net.UnixConn) (uint32, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	if cred.Pid <= 0 {
		return 0, fmt.Errorf("SO_PEERCRED: pid %d (the process is in a PID namespace the machine cannot see)", cred.Pid)
	}
	return uint32(cred.Pid), nil
}
