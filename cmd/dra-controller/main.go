// Command dra-controller is the cluster-wide component of the gpu.dra.dev
// DRA driver: the validating admission webhook for opaque GPU configs, the
// GFD-compatible node labels and the per-model DeviceClasses. All logic
// lives in pkg/controller.
package main

import (
	"context"
	"fmt"
	"os"

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
	return cliflags.Execute(cliflags.Command{
		Name:     "dra-controller",
		AddFlags: cfg.AddFlags,
		Validate: cfg.Validate,
		Run:      func(ctx context.Context) error { return controller.Run(ctx, &cfg) },
	}, os.Args[1:])
}
