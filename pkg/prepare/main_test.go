package prepare

import (
	"os"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
)

func TestMain(m *testing.M) { os.Exit(simnode.Main(m)) }
