package telemetry_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/internal/testfs"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/podattribution"
	"github.com/gpu-dra/gpu-dra-driver/pkg/prepare"
	"github.com/gpu-dra/gpu-dra-driver/pkg/telemetry"
)

// BenchmarkScrape is one scrape of a node with 8 GPUs and 32 pods (four
// time-sliced pods per GPU, each running one process), with the processes'
// cgroups read through podattribution.Processes as in the plugin. It
// reports the NVML calls and cgroup reads per scrape.
func BenchmarkScrape(b *testing.B) {
	node := simnode.New(b, "dgxh100", "node-1")
	procRoot := b.TempDir()
	holders := map[string][]telemetry.Holder{}
	pid := uint32(1000)
	for g, gpu := range node.GPUs {
		for i := range 4 {
			pid++
			podUID := fmt.Sprintf("00000000-0000-4000-8000-%012d", pid)
			containerID := fmt.Sprintf("%064d", pid)
			testfs.WriteProcess(b, procRoot, int(pid), uint64(pid), "0::/kubepods/besteffort/pod"+podUID+"/"+containerID+"\n")
			stop, err := node.Machine.RegisterProcess(pid, nvmlsim.Registration{Devices: []string{gpu.UUID}, SMPercent: uint32(5 + 5*i), MemoryBytes: 1 << 30})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(stop)
			holders[gpu.UUID] = append(holders[gpu.UUID], telemetry.Holder{
				Device: fmt.Sprintf("gpu-%d-ts", g), Namespace: "team", Claim: fmt.Sprintf("claim-%d", pid),
				Pod: fmt.Sprintf("pod-%d", pid), PodUID: podUID, Container: "main", ContainerIDs: []string{containerID},
			})
		}
	}
	procs := podattribution.NewProcesses(procRoot, nil)
	c := telemetry.NewCollector(telemetry.CollectorOptions{
		NVML: node.Machine, NodeName: "node-1", GPUs: node.GPUs,
		Holders:   telemetry.HolderFunc(func() map[string][]telemetry.Holder { return holders }),
		Processes: prepare.ProcessOwners(procs),
	})
	h := telemetry.Handler(telemetry.NewRegistry(telemetry.NewDriverMetrics("node-1"), c))
	scrape := func() int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, telemetry.MetricsPath, nil))
		if rec.Code != http.StatusOK {
			b.Fatalf("scrape: HTTP %d", rec.Code)
		}
		n, _ := io.Copy(io.Discard, rec.Body)
		return int(n)
	}
	bytes := scrape() // the cgroups are read once, on the first scrape
	calls, reads := node.Machine.Calls(), procs.Reads()
	b.ResetTimer()
	for range b.N {
		scrape()
	}
	b.StopTimer()
	b.ReportMetric(float64(node.Machine.Calls()-calls)/float64(b.N), "nvml-calls/scrape")
	b.ReportMetric(float64(procs.Reads()-reads)/float64(b.N), "cgroup-reads/scrape")
	b.ReportMetric(float64(bytes), "bytes/scrape")
	if reads != 32 {
		b.Errorf("%d cgroup reads on the first scrape, want 32 (one per process)", reads)
	}
}
