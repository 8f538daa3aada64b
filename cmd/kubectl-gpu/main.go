// Command kubectl-gpu is the kubectl plugin `kubectl gpu`: the GPUs a DRA
// driver publishes, what is free and who holds what. Install it on PATH as
// kubectl-gpu. All logic lives in pkg/kubectlgpu (its command line in pkg/kubectlgpu/cli).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cmd := cli.NewCommand(cli.Options{
		Streams: genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr},
	})
	err := cmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
