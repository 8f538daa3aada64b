package vocabulary

import "testing"

func TestChannelNames(t *testing.T) {
	const clique = "5e1f0000-0000-4000-8000-000000000001.1"
	pool := ChannelPoolName(clique)
	if got, ok := ChannelPoolClique(pool); !ok || got != clique {
		t.Errorf("ChannelPoolClique(%q) = %q, %v", pool, got, ok)
	}
	for _, p := range []string{"gpu-node-0", "imex-channels.", ""} {
		if _, ok := ChannelPoolClique(p); ok {
			t.Errorf("ChannelPoolClique(%q) took a pool that is not a clique's", p)
		}
	}
	for _, n := range []int{0, 7, 2047} {
		if got, err := ChannelNumber(ChannelDeviceName(n)); err != nil || got != n {
			t.Errorf("ChannelNumber(ChannelDeviceName(%d)) = %d, %v", n, got, err)
		}
	}
	for _, d := range []string{"gpu-0", "channel-", "channel--1", "channel-01", "channel-x"} {
		if _, err := ChannelNumber(d); err == nil {
			t.Errorf("ChannelNumber(%q) took it", d)
		}
	}
}
