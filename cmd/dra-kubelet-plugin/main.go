// Command dra-kubelet-plugin is the node agent of the gpu.dra.dev DRA driver:
// it publishes the node's GPUs as ResourceSlices and prepares ResourceClaims
// for the kubelet. All logic lives in pkg/app.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/app"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cliflags"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg := app.Config{Out: os.Stdout}
	fs := pflag.NewFlagSet("dra-kubelet-plugin", pflag.ContinueOnError)
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
	ctx = klog.NewContext(ctx, klog.Background().WithName("dra-kubelet-plugin"))
	return app.Run(ctx, &cfg)
}
