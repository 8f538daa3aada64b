package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/gpu-dra/gpu-dra-driver/internal/standin/clusternodes"
)

// clockTick is the kernel's USER_HZ, the unit of /proc/<pid>/stat times:
// 100 on every Linux architecture this runs on.
const clockTick = 10 * time.Millisecond

// scheduler reads what kube-scheduler spends: its CPU from /proc (it runs
// on this machine), its attempt counts and CPU profile from its secure port.
type scheduler struct {
	pid  int
	url  string
	http *http.Client
	// plane are the other control-plane processes by name, whose CPU
	// the samples read too.
	plane map[string]int
}

// newScheduler reads kube-scheduler at pid and url, and the processes
// planePIDs names ("name=PID,...").
func newScheduler(cfg *rest.Config, pid int, url, planePIDs string) (*scheduler, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("-scheduler-pid %d: want the PID of kube-scheduler (hack/demo/bench-cluster.sh passes it)", pid)
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(comm)) != "kube-scheduler" {
		return nil, fmt.Errorf("-scheduler-pid %d is not kube-scheduler (comm %q): %v", pid, strings.TrimSpace(string(comm)), err)
	}
	// The admin's client certificate; the scheduler's serving certificate
	// is self-signed.
	c := rest.CopyConfig(cfg)
	c.Host = url
	c.Insecure, c.CAFile, c.CAData = true, "", nil
	client, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("client for kube-scheduler at %s: %w", url, err)
	}
	plane := map[string]int{}
	for _, kv := range strings.Split(planePIDs, ",") {
		if kv == "" {
			continue
		}
		name, value, _ := strings.Cut(kv, "=")
		p, err := strconv.Atoi(value)
		if err != nil || p <= 0 || name == "" {
			return nil, fmt.Errorf("-control-plane-pids: %q is not name=PID", kv)
		}
		plane[name] = p
	}
	return &scheduler{pid: pid, url: url, http: client, plane: plane}, nil
}

// sample is the state at one moment.
type sample struct {
	at                 time.Time
	schedCPU, benchCPU time.Duration
	unschedulable      float64
	attempts           float64
	publications       int64
	load               string
	planeCPU           map[string]time.Duration
}

func (s *scheduler) sample(ctx context.Context, f *clusternodes.Followers) sample {
	load := "?"
	if data, err := os.ReadFile("/proc/loadavg"); err == nil && len(strings.Fields(string(data))) >= 3 {
		load = strings.Join(strings.Fields(string(data))[:3], " ")
	}
	return sample{
		at: time.Now(), schedCPU: cpuTime(s.pid), benchCPU: cpuTime(os.Getpid()),
		unschedulable: s.attempts(ctx, "unschedulable"), attempts: s.attempts(ctx, ""), publications: f.Publications(),
		load: load, planeCPU: planeCPU(s.plane),
	}
}

// planeCPU reads the CPU time of each process of plane.
func planeCPU(plane map[string]int) map[string]time.Duration {
	out := make(map[string]time.Duration, len(plane))
	for name, pid := range plane {
		out[name] = cpuTime(pid)
	}
	return out
}

// since is the phase from before to s, in which pods were bound.
func (s sample) since(before sample, pods int) phase {
	return phase{
		pods: pods, took: s.at.Sub(before.at), schedCPU: s.schedCPU - before.schedCPU, benchCPU: s.benchCPU - before.benchCPU,
		unschedulable: s.unschedulable - before.unschedulable, attempts: s.attempts - before.attempts,
		publications: s.publications - before.publications,
		load:         before.load + " → " + s.load,
		planeCPU:     diff(s.planeCPU, before.planeCPU),
	}
}

// diff is a - b per name.
func diff(a, b map[string]time.Duration) map[string]time.Duration {
	out := make(map[string]time.Duration, len(a))
	for name, v := range a {
		out[name] = v - b[name]
	}
	return out
}

// cpuTime is the user and system time of process pid so far, 0 when it
// cannot be read.
func cpuTime(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses and
	// may hold spaces: state is field 3, utime 14, stime 15.
	rest := string(data)
	rest = rest[strings.LastIndexByte(rest, ')')+1:]
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * clockTick
}

// attempts sums scheduler_schedule_attempts_total with result (any result
// when empty), -1 when the metrics cannot be read.
func (s *scheduler) attempts(ctx context.Context, result string) float64 {
	lines, err := s.metrics(ctx, "scheduler_schedule_attempts_total{")
	if err != nil {
		return -1
	}
	sum := 0.0
	for _, line := range lines {
		if strings.Contains(line, `result="`+result) {
			if f := strings.Fields(line); len(f) == 2 {
				v, _ := strconv.ParseFloat(f[1], 64)
				sum += v
			}
		}
	}
	return sum
}

// metrics returns the scheduler's metric lines that start with prefix.
func (s *scheduler) metrics(ctx context.Context, prefix string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", s.url, resp.Status)
	}
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, prefix) {
			lines = append(lines, line)
		}
	}
	return lines, sc.Err()
}

// profile fetches a CPU profile of seconds into path, in the background.
func (s *scheduler) profile(ctx context.Context, path string, seconds int) <-chan error {
	return fetchProfile(ctx, s.http, s.url, path, seconds)
}

// fetchProfile fetches a CPU profile of seconds from the component serving
// /debug/pprof at url into path, in the background.
func fetchProfile(ctx context.Context, client *http.Client, url, path string, seconds int) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", url, seconds), nil)
			if err != nil {
				return err
			}
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			defer func() { _ = resp.Body.Close() }()
			if resp.StatusCode != http.StatusOK {
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
				return fmt.Errorf("GET %s/debug/pprof/profile: %s: %s", url, resp.Status, body)
			}
			f, err := os.Create(path)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, resp.Body); err != nil {
				_ = f.Close()
				return fmt.Errorf("write %s: %w", path, err)
			}
			return f.Close()
		}()
	}()
	return done
}
