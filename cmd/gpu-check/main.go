// Command gpu-check runs the driver's code paths read-only on a node's
// real GPUs (or, with --simulate, a simulated machine), compares them with
// the simulated GPUs of the same model and writes a report; see
// docs/hardware.md and hack/gpu-check.sh. All logic lives in pkg/hwcheck.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/gpu-dra/gpu-dra-driver/pkg/cliflags"
	"github.com/gpu-dra/gpu-dra-driver/pkg/hwcheck"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func run() error {
	var cfg hwcheck.Config
	return cliflags.Execute(cliflags.Command{
		Name:     "gpu-check",
		AddFlags: cfg.AddFlags,
		Validate: cfg.Validate,
		Run:      func(ctx context.Context) error { return hwcheck.Run(ctx, cfg) },
	}, os.Args[1:])
}
