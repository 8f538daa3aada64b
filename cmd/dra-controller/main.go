// Command dra-controller is the cluster-wide component of the gpu.dra.dev
// DRA driver: the validating admission webhook for opaque GPU configs, the
// GFD-compatible node labels and the per-model DeviceClasses. All logic
// lives in pkg/controller.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/cliflags"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func run() error {
	var cfg controller.Config
	fs := pflag.NewFlagSet("dra-controller", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	logging := cliflags.AddLoggingFlags(fs)
	cliflags.AddEnvToUsage(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == pflag.ErrHelp {
			return nil
		}
		return err
	}
	if err := cliflags.ApplyEnv(fs, nil); err != nil {
		return err
	}
	flush, err := logging.Apply()
	defer flush()
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background().WithName("dra-controller"))
	return controller.Run(ctx, &cfg)
}
