package cliflags

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"k8s.io/klog/v2"
)

// Command is what a project binary's main needs: its flags, a check of
// them, and what it runs.
type Command struct {
	Name     string
	AddFlags func(*pflag.FlagSet)
	Validate func() error
	Run      func(ctx context.Context) error
}

// Execute parses args (flags, then their environment twins), sets up
// component-base logging, and runs the command until SIGINT or SIGTERM.
// --help prints usage and returns nil.
func Execute(c Command, args []string) error {
	fs := pflag.NewFlagSet(c.Name, pflag.ContinueOnError)
	c.AddFlags(fs)
	logging := AddLoggingFlags(fs)
	AddEnvToUsage(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := ApplyEnv(fs, nil); err != nil {
		return err
	}
	flush, err := logging.Apply()
	defer flush()
	if err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background().WithName(c.Name))
	return c.Run(ctx)
}
