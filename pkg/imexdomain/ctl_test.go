package imexdomain

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/component-base/metrics"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/imex"
)

// Reports as the simulated nvidia-imex-ctl -N prints them, and with other
// spacing: the parser reads words, not columns.
const (
	reportLost = `Connectivity Table Legend:
I - Invalid - Node wasn't reachable, no connection status available
N - Never Connected
D - Disconnected - Connection was lost
C - Connected - Ready for operation

Nodes:
Node #0   - 127.0.0.2       - READY        - Version: simulated
Node #1   - 127.0.0.3       - UNAVAILABLE  - Version: simulated
Node #2   - 127.0.0.4       - READY        - Version: simulated

 Nodes From\To   0   1   2
             0    C   D   C
             1    I   I   I
             2    C   D   C
Domain State: DOWN
`
	reportUpTight = "Nodes:\nNode #0 - 127.0.0.2 - READY - Version: 1\nNode#1-127.0.0.3-READY-Version: 1\n" +
		"Nodes From\\To 0 1\n0 C C\n1 C C\nDomain State:UP\n"
)

func TestParseCtl(t *testing.T) {
	for _, tc := range []struct {
		name, out, ip string
		view          map[string]string
		up            bool
	}{
		{"lost peer", reportLost, "127.0.0.2", map[string]string{"127.0.0.3": "D", "127.0.0.4": "C"}, false},
		{"row unavailable", reportLost, "127.0.0.3", map[string]string{"127.0.0.2": "I", "127.0.0.4": "I"}, false},
		{"tight spacing", reportUpTight, "127.0.0.3", map[string]string{"127.0.0.2": "C"}, true},
		{"not listed", reportLost, "127.0.0.9", nil, false},
		{"garbage", "Connection to IMEX daemon failed\n", "127.0.0.2", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := parseCtl(tc.out)
			if got := r.view(tc.ip); !reflect.DeepEqual(got, tc.view) || r.up != tc.up {
				t.Errorf("view %v up %v, want %v %v", got, r.up, tc.view, tc.up)
			}
		})
	}
}

// A lost peer makes the node's entry Disconnected with the peer named, one
// IMEXPeerUnreachable Event on the domain (not one per poll) and the
// peers metric.
func TestPollLostPeer(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "report")
	if err := os.WriteFile(out, []byte(reportLost), 0o644); err != nil {
		t.Fatal(err)
	}
	ctl := filepath.Join(dir, "nvidia-imex-ctl")
	if err := os.WriteFile(ctl, []byte("#!/bin/sh\ncat "+out+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	events := fake.NewClientset()
	n := New(Options{Manager: imex.NewManager(imex.Config{StateDir: dir}), Events: events.CoreV1(), NodeName: "tray-1", NodeIP: "127.0.0.2", Ctl: ctl})
	d := Domain{Namespace: "ns", Name: "training", UID: "uid-1", Channel: 3}
	n.joined = d
	reg := metrics.NewKubeRegistry() // before the readings: an unregistered metric drops them
	n.Metrics().MustRegister(reg)
	cd := &gpuv1beta1.ComputeDomain{Status: gpuv1beta1.ComputeDomainStatus{Nodes: []gpuv1beta1.ComputeDomainNode{
		{Name: "tray-1", IPAddress: "127.0.0.2"}, {Name: "tray-2", IPAddress: "127.0.0.3"}, {Name: "tray-3", IPAddress: "127.0.0.4"},
	}}}
	ctx := context.Background()
	for range 2 {
		st := n.poll(ctx, d, cd)
		if st.State != gpuv1beta1.DaemonDisconnected || !slices.Equal(st.UnreachablePeers, []string{"tray-2"}) || !strings.Contains(st.Message, "tray-2") {
			t.Fatalf("status %+v, want Disconnected from tray-2", st)
		}
	}
	list, err := events.CoreV1().Events("ns").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Reason != EventPeerUnreachable || list.Items[0].InvolvedObject.Name != "training" ||
		!strings.Contains(list.Items[0].Message, "tray-2") {
		t.Errorf("events %+v, want one %s on training naming tray-2", list.Items, EventPeerUnreachable)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if f.GetName() == "gpu_dra_imex_daemon_peers" && l.GetName() == "state" {
					got[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	if want := map[string]float64{"connected": 1, "unreachable": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("gpu_dra_imex_daemon_peers by state %v, want %v", got, want)
	}
}
