package hwcheck

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sync"
	"time"

	"k8s.io/component-base/metrics"

	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/telemetry"
)

// health runs the driver's health monitor for HealthWatch and reports the
// events it saw and each GPU's state.
func (c *check) health(ctx context.Context, r *Report) error {
	uuids := make([]string, len(c.gpus))
	names := map[string]string{}
	for i, g := range c.gpus {
		uuids[i], names[g.UUID] = g.UUID, g.CanonicalName()
	}
	var mu sync.Mutex
	var events []string
	mon, err := health.NewMonitor(health.Options{
		NVML: c.nvml, GPUs: uuids,
		OnEvent: func(e health.Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, fmt.Sprintf("%s %s xid=%d ignored=%v", names[e.GPUUUID], e.Type, e.XID, e.Ignored))
		},
	})
	if err != nil {
		return err
	}
	watch, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := mon.Start(watch); err != nil {
		return fmt.Errorf("start health monitor: %w", err)
	}
	select {
	case <-time.After(c.cfg.HealthWatch):
	case <-ctx.Done():
	}
	snap := mon.Snapshot()
	cancel()
	<-mon.Done()

	res := &HealthResult{Watched: c.cfg.HealthWatch, Status: map[string]string{}}
	mu.Lock()
	res.Events = events
	mu.Unlock()
	for uuid, st := range snap {
		res.Status[names[uuid]] = st.String()
		if st.EventsUnsupported {
			res.EventsUnsupported = append(res.EventsUnsupported, names[uuid])
		}
	}
	slices.Sort(res.EventsUnsupported)
	r.Health, r.healthSnap = res, snap
	return ctx.Err()
}

// snapshotSource gives the collector the health the health phase saw.
type snapshotSource health.Snapshot

func (s snapshotSource) Snapshot() health.Snapshot { return health.Snapshot(s) }

// descName pulls the metric name out of a Desc's String form; the Desc
// API does not expose it.
var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

// telemetry scrapes the device metrics once and reports, per device,
// which of the driver's readings NVML gave no value for (the NVML calls
// behind them and their return codes are in the report's call table).
func (c *check) telemetry(_ context.Context, r *Report) error {
	opts := telemetry.CollectorOptions{NVML: c.nvml, NodeName: c.cfg.NodeName, GPUs: c.gpus, MIGDeviceName: devicemodel.StaticMIGDeviceName}
	if c.healthSnap != nil {
		opts.Health = snapshotSource(c.healthSnap)
	}
	collector := telemetry.NewCollector(opts)
	descs := make(chan *metrics.Desc, 64)
	go func() {
		collector.DescribeWithStability(descs)
		close(descs)
	}()
	var exported []string
	for d := range descs {
		if m := descName.FindStringSubmatch(d.String()); m != nil {
			exported = append(exported, m[1])
		}
	}
	if len(exported) == 0 {
		return fmt.Errorf("no metric names found in the collector's descriptions")
	}
	reg := telemetry.NewRegistry(nil, collector)
	start := time.Now()
	families, err := reg.Gather()
	if err != nil {
		return fmt.Errorf("scrape: %w", err)
	}
	r.timing("one telemetry scrape", start)

	present := map[string]map[string]bool{} // uuid → metric names
	samples := 0
	for _, f := range families {
		for _, m := range f.GetMetric() {
			samples++
			for _, l := range m.GetLabel() {
				if l.GetName() == "uuid" {
					if present[l.GetValue()] == nil {
						present[l.GetValue()] = map[string]bool{}
					}
					present[l.GetValue()][f.GetName()] = true
				}
			}
		}
	}
	res := &TelemetryResult{Exported: exported, Missing: map[string][]string{}, Samples: samples}
	for _, uuid := range slices.Sorted(maps.Keys(present)) {
		for _, name := range exported {
			if !present[uuid][name] {
				res.Missing[uuid] = append(res.Missing[uuid], name)
			}
		}
	}
	for _, g := range c.gpus {
		if present[g.UUID] == nil {
			res.Missing[g.UUID] = []string{"(every metric)"}
		}
	}
	r.Telemetry = res
	return nil
}
