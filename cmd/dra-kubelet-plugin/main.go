// Command dra-kubelet-plugin is the node agent of the gpu.dra.dev DRA driver:
// it publishes the node's GPUs as ResourceSlices and prepares ResourceClaims
// for the kubelet. All logic lives in pkg/nodeplugin.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/gpu-dra/gpu-dra-driver/pkg/cliflags"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg := nodeplugin.Config{Out: os.Stdout}
	return cliflags.Execute(cliflags.Command{
		Name:     "dra-kubelet-plugin",
		AddFlags: cfg.AddFlags,
		Validate: cfg.Validate,
		Run:      func(ctx context.Context) error { return nodeplugin.Run(ctx, &cfg) },
	}, os.Args[1:])
}
