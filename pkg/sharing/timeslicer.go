package sharing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// ErrLevelUnknown is returned by TimeSlicer.Timeslice when the level in
// force cannot be read; the manager then restores Default (0) after the last
// share.
var ErrLevelUnknown = errors.New("time-slice level cannot be read")

// TimeSlicer sets the time-slice level of a physical GPU: 0 (Default),
// 1 (Short), 2 (Medium) or 3 (Long), the values of
// `nvidia-smi compute-policy --set-timeslice`. NVML has no call for it.
// Errors for a device or driver without support wrap ErrNotSupported.
type TimeSlicer interface {
	// SetTimeslice sets the level of the GPU.
	SetTimeslice(ctx context.Context, gpu DeviceRef, level int) error
	// Timeslice returns the level in force, or an error wrapping
	// ErrLevelUnknown when it cannot be read.
	Timeslice(ctx context.Context, gpu DeviceRef) (int, error)
}

// nvidia-smi exit codes (nvidia-smi(1), RETURN VALUE).
const (
	smiExitInvalidArgument = 2 // also an unknown subcommand, e.g. compute-policy on an old driver
	smiExitNotSupported    = 3 // the operation is not available on the device
)

// NvidiaSMITimeSlicer sets time-slices with
// `nvidia-smi compute-policy -i <uuid> --set-timeslice=<level>`.
type NvidiaSMITimeSlicer struct {
	// Path is the nvidia-smi binary, normally the driver root's
	// usr/bin/nvidia-smi as the plugin sees it.
	Path string
	// Env is the environment of nvidia-smi ("NAME=value"), for example an
	// LD_LIBRARY_PATH that finds libnvidia-ml in the driver root; nil
	// inherits the plugin's.
	Env []string
	// Timeout bounds one run; 0 means 30 seconds.
	Timeout time.Duration
}

var _ TimeSlicer = (*NvidiaSMITimeSlicer)(nil)

// SetTimeslice runs nvidia-smi compute-policy for the GPU. It reports
// ErrNotSupported for a MIG device (the time-slice is a policy of the
// physical GPU), for a missing nvidia-smi, and when nvidia-smi says the
// operation is not supported or does not know compute-policy (exit codes 3
// and 2: the arguments it is given are always well formed).
func (s *NvidiaSMITimeSlicer) SetTimeslice(ctx context.Context, gpu DeviceRef, level int) error {
	if gpu.IsMIG() {
		return fmt.Errorf("set time-slice of MIG device %s: %w: the time-slice is a policy of the physical GPU", gpu.UUID, ErrNotSupported)
	}
	if err := gpu.validate(); err != nil {
		return err
	}
	if level < 0 || level > 3 {
		return fmt.Errorf("set time-slice of %s: level %d is not one of 0-3", gpu.UUID, level)
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	args := []string{"compute-policy", "-i", gpu.UUID, "--set-timeslice=" + strconv.Itoa(level)}
	cmd := exec.CommandContext(ctx, s.Path, args...)
	cmd.Env = s.Env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err == nil {
		return nil
	}
	what := fmt.Sprintf("%s %s", s.Path, strings.Join(args, " "))
	output := strings.TrimSpace(out.String())
	var exitErr *exec.ExitError
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s: %w: %w", what, ErrNotSupported, err)
	case errors.As(err, &exitErr) && ctx.Err() == nil &&
		(exitErr.ExitCode() == smiExitNotSupported || exitErr.ExitCode() == smiExitInvalidArgument):
		return fmt.Errorf("%s: %w: %w: %s", what, ErrNotSupported, err, output)
	default:
		return fmt.Errorf("%s: %w: %s", what, err, output)
	}
}

// Timeslice always reports ErrLevelUnknown: nvidia-smi has no stable
// output that shows the level.
func (s *NvidiaSMITimeSlicer) Timeslice(_ context.Context, gpu DeviceRef) (int, error) {
	return 0, fmt.Errorf("time-slice of %s: %w", gpu.UUID, ErrLevelUnknown)
}
