package hwcheck

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// The report lists a device's counter problems in counter order, the same
// in every run (the report is compared across runs and machines).
func TestCheckCountersInCounterOrder(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-1")
	s := cloneShape(ShapeOf(node.GPUs[0], devicemodel.Options{}))
	d := s.Devices["gpu"]
	d.Consumes = map[string]string{"bogus-d": "1", "bogus-a": "1", "bogus-c": "1", "bogus-b": "1", "bogus-e": "1"}
	s.Devices["gpu"] = d
	var want []string
	for range 20 {
		var got []string
		for _, p := range CheckCounters(s) {
			if _, rest, ok := strings.Cut(p, "consumes counter "); ok {
				counter, _, _ := strings.Cut(rest, ",")
				got = append(got, counter)
			}
		}
		if !slices.IsSorted(got) || len(got) != len(d.Consumes) {
			t.Fatalf("unknown counters reported as %v, want the 5 in order", got)
		}
		if want == nil {
			want = got
		}
		if !slices.Equal(got, want) {
			t.Fatalf("problems %v, then %v", want, got)
		}
	}
}

// Two unknown machines: the error names the first flag, every time.
func TestValidateNamesTheFirstBadMachine(t *testing.T) {
	for range 20 {
		cfg := simConfig(t, "no-such-machine")
		cfg.CompareWith = "no-such-either"
		if err := cfg.Validate(); err == nil || !strings.HasPrefix(err.Error(), `--simulate="no-such-machine"`) {
			t.Fatalf("Validate = %v, want it to name --simulate", err)
		}
	}
}
