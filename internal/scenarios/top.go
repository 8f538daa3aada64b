package scenarios

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
)

// LoadProgram is the simulated CUDA job (cmd/gpu-load-sim) of the driver image.
const LoadProgram = "/usr/bin/gpu-load-sim"

// GPULoad is what a container running LoadProgram declares.
type GPULoad struct {
	Namespace, Pod, Container string
	// SMPercent is its --sm, MemoryBytes its --memory.
	SMPercent   float64
	MemoryBytes int64
}

// Loads returns the loads the scenario's pods declare: every container
// whose command runs LoadProgram, with its --sm and --memory (default 50
// and 1Gi, as the program's).
func Loads(s *Scenario) []GPULoad {
	var out []GPULoad
	for _, o := range s.Objects {
		if o.GetKind() != "Pod" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "containers")
		for _, c := range containers {
			m, _ := c.(map[string]any)
			command, _, _ := unstructured.NestedStringSlice(m, "command")
			if len(command) == 0 || command[0] != LoadProgram {
				continue
			}
			load := GPULoad{Namespace: o.GetNamespace(), Pod: o.GetName(), SMPercent: 50, MemoryBytes: 1 << 30}
			load.Container, _, _ = unstructured.NestedString(m, "name")
			for _, arg := range command[1:] {
				if v, ok := strings.CutPrefix(arg, "--sm="); ok {
					if sm, err := strconv.ParseFloat(v, 64); err == nil {
						load.SMPercent = sm
					}
				}
				if v, ok := strings.CutPrefix(arg, "--memory="); ok {
					if q, err := resource.ParseQuantity(v); err == nil {
						load.MemoryBytes = q.Value()
					}
				}
			}
			out = append(out, load)
		}
	}
	return out
}

// Top runs `kubectl gpu top -o json` with args.
func (r *Runner) Top(ctx context.Context, args ...string) (*kubectlgpu.TopList, error) {
	var list kubectlgpu.TopList
	if err := r.KubectlGPUJSON(ctx, &list, append([]string{"top"}, args...)...); err != nil {
		return nil, err
	}
	return &list, nil
}

// TopProblems compares what top shows with the loads: each load's
// container shows its SM percent within tolerance points, on a device of
// the driver.
func TopProblems(list *kubectlgpu.TopList, loads []GPULoad, tolerance float64) []string {
	var problems []string
	for _, l := range loads {
		i := slices.IndexFunc(list.Items, func(row kubectlgpu.TopRow) bool {
			return row.Namespace == l.Namespace && row.Pod == l.Pod && row.Container == l.Container
		})
		switch {
		case i < 0:
			problems = append(problems, fmt.Sprintf("kubectl gpu top shows no row for %s/%s container %s", l.Namespace, l.Pod, l.Container))
		case list.Items[i].SMPercent == nil:
			problems = append(problems, fmt.Sprintf("kubectl gpu top shows no SM figure for %s/%s", l.Namespace, l.Pod))
		case math.Abs(*list.Items[i].SMPercent-l.SMPercent) > tolerance:
			problems = append(problems, fmt.Sprintf("kubectl gpu top: %s/%s uses %.1f%% SM, it declares %.0f%% (tolerance %.0f)",
				l.Namespace, l.Pod, *list.Items[i].SMPercent, l.SMPercent, tolerance))
		}
	}
	return problems
}

// WaitTop polls `kubectl gpu top -n namespace` until it shows loads within
// tolerance, and returns its last list with what is still wrong.
func (r *Runner) WaitTop(ctx context.Context, namespace string, loads []GPULoad, tolerance float64) (*kubectlgpu.TopList, []string, error) {
	var list *kubectlgpu.TopList
	var problems []string
	err := r.poll(ctx, "kubectl gpu top to show the declared loads", func(ctx context.Context) (bool, error) {
		var err error
		if list, err = r.Top(ctx, "-n", namespace); err != nil {
			problems = []string{err.Error()}
			return false, nil
		}
		problems = TopProblems(list, loads, tolerance)
		return len(problems) == 0, nil
	})
	if err != nil && len(problems) > 0 {
		return list, problems, nil
	}
	return list, problems, err
}

// StopLoad makes a container's LoadProgram (its PID 1) stop its load.
func (r *Runner) StopLoad(ctx context.Context, l GPULoad) error {
	_, err := r.Cluster.Exec(ctx, l.Namespace, l.Pod, l.Container, "kill", "-USR1", "1")
	return err
}

// ShowTop, for a scenario whose pods run loads, waits until `kubectl gpu
// top` tells them apart, prints its table to w and returns what is wrong.
func (r *Runner) ShowTop(ctx context.Context, s *Scenario, w io.Writer) []string {
	loads := Loads(s)
	if len(loads) == 0 {
		return nil
	}
	var problems []string
	for _, ns := range s.Namespaces() {
		var mine []GPULoad
		for _, l := range loads {
			if l.Namespace == ns {
				mine = append(mine, l)
			}
		}
		_, p, err := r.WaitTop(ctx, ns, mine, 2)
		if err != nil {
			return append(problems, err.Error())
		}
		problems = append(problems, p...)
		fmt.Fprintf(w, "  $ kubectl gpu top -n %s\n", ns)
		out, err := r.KubectlGPU(ctx, "top", "-n", ns)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
			fmt.Fprintf(w, "    %s\n", l)
		}
	}
	return problems
}
