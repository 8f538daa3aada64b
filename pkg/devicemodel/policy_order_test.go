package devicemodel

import (
	"strings"
	"testing"
)

// Of several mistakes in a policy, Validate names the same one every time:
// the first GPU key in order, and time-slicing before MPS.
func TestPolicyValidateNamesTheFirstMistake(t *testing.T) {
	bad := &SharePolicy{MaxShares: 65}
	p := Policy{GPUs: map[string]GPUPolicy{}}
	for _, key := range []string{"H200", "A100", "L4", "B200"} {
		p.GPUs[key] = GPUPolicy{TimeSlicing: bad, MPS: bad}
	}
	for range 20 {
		err := p.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), "gpus[A100].timeSlicing.maxShares:") {
			t.Fatalf("Validate = %v, want gpus[A100].timeSlicing named", err)
		}
	}
}
