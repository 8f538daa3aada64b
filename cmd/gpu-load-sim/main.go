// Command gpu-load-sim is the simulated counterpart of a CUDA job, for demos
// and tests on simulated GPUs: it registers with the simulated driver the
// devices its container got, the SM share it keeps busy and the memory it
// holds, and stays registered until it exits. SIGUSR1 stops the load,
// SIGUSR2 resumes it. All logic lives in pkg/nvmlsim/loadsim.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/loadsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(loadsim.Main(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr))
}
