package sharing_test

import (
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/simhooks"
	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

// The time-slicing tests run over the simulation's time-slicer, which lives
// beside pkg/nvmlsim.
func init() {
	sharing.NewSimSlicer = func(m *nvmlsim.Machine) sharing.TimeSlicer { return simhooks.NewTimeSlicer(m) }
}
