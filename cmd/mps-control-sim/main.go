// Command mps-control-sim simulates nvidia-cuda-mps-control for demos and
// tests; it runs no MPS server. Install it as nvidia-cuda-mps-control (a copy
// or a symlink) in a simulated driver root; all logic lives in
// pkg/nvmlsim/mpscontrol.
package main

import (
	"os"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/mpscontrol"
)

func main() {
	os.Exit(mpscontrol.Main(os.Args, os.Getenv, os.Stdin, os.Stdout, os.Stderr))
}
