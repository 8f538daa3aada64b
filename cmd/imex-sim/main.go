// Command imex-sim simulates NVIDIA's IMEX daemon for demos and tests: installed
// as nvidia-imex it is the daemon, as nvidia-imex-ctl its control command
// (copies or symlinks). It shares no GPU memory; all logic lives in
// pkg/nvmlsim/imexd.
package main

import (
	"os"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/imexd"
)

func main() {
	os.Exit(imexd.Main(os.Args, os.Stdout, os.Stderr))
}
