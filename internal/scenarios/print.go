package scenarios

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// PrintPod writes a pod report: pod, node, claims and devices, and what each
// container sees.
func PrintPod(w io.Writer, rep *PodReport) {
	state := string(rep.Phase)
	if rep.ExpectPending {
		state += " (expected)"
	}
	node := rep.Node
	if node == "" {
		node = "<not bound>"
	}
	fmt.Fprintf(w, "  pod %s/%s: %s on %s\n", rep.Namespace, rep.Name, state, node)
	for _, e := range rep.Events {
		fmt.Fprintf(w, "    event: %s\n", oneLine(e, 200))
	}
	for _, c := range rep.Claims {
		label := c.PodClaimName
		if c.Extended {
			label = "extended resources"
		}
		fmt.Fprintf(w, "    claim %s (%s):\n", c.Name, label)
		if len(c.Devices) == 0 {
			fmt.Fprintf(w, "      not allocated\n")
		}
		for _, d := range c.Devices {
			fmt.Fprintf(w, "      %s -> %s/%s%s\n", d.Request, d.Pool, d.Device, deviceDetail(d))
			for _, p := range d.MPSDaemons {
				fmt.Fprintf(w, "        MPS control daemon: %s\n", p)
			}
		}
	}
	for _, name := range rep.ContainerOrder {
		v := rep.Containers[name]
		fmt.Fprintf(w, "    container %s sees:\n", name)
		if v.Err != nil {
			fmt.Fprintf(w, "      error: %v\n", v.Err)
			continue
		}
		keys := make([]string, 0, len(v.Env))
		for k := range v.Env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "      %s=%s\n", k, v.Env[k])
		}
		if len(keys) == 0 {
			fmt.Fprintf(w, "      (no NVIDIA_* or CUDA_* variables)\n")
		}
		fmt.Fprintf(w, "      ls /dev/nvidia*: %s\n", strings.Join(v.DevNodes, " "))
		if len(v.MPSPipe) > 0 {
			fmt.Fprintf(w, "      ls $CUDA_MPS_PIPE_DIRECTORY: %s\n", strings.Join(v.MPSPipe, " "))
		}
		fmt.Fprintf(w, "      nvidia-smi -L:\n")
		for _, l := range strings.Split(v.NvidiaSMI, "\n") {
			fmt.Fprintf(w, "        %s\n", l)
		}
	}
}

func deviceDetail(d DeviceReport) string {
	a := d.Attributes
	var parts []string
	if a[vocabulary.AttrProductName] != "" {
		parts = append(parts, a[vocabulary.AttrProductName])
	}
	switch deviceKind(a) {
	case vocabulary.KindMIG:
		parts = append(parts, fmt.Sprintf("MIG %s at placement %s of GPU %s", a[vocabulary.AttrProfile], a[vocabulary.AttrPlacementStart], a[vocabulary.AttrParentMinor]))
	case vocabulary.KindTimeSlice, vocabulary.KindMPS:
		parts = append(parts, fmt.Sprintf("%s share of GPU %s", a[vocabulary.AttrType], a[vocabulary.AttrMinor]))
	}
	if n := a[vocabulary.AttrNUMANode]; n != "" {
		parts = append(parts, "NUMA "+n)
	}
	if n := a[vocabulary.AttrNVLinkDomain]; n != "" {
		parts = append(parts, "NVLink domain "+n)
	}
	if d.ShareID != "" {
		parts = append(parts, "share "+shortID(d.ShareID))
	}
	if len(d.Consumed) > 0 {
		var caps []string
		for k, v := range d.Consumed {
			caps = append(caps, k+"="+v)
		}
		sort.Strings(caps)
		parts = append(parts, strings.Join(caps, " "))
	}
	if len(parts) == 0 {
		return ""
	}
	return " [" + strings.Join(parts, ", ") + "]"
}

// PrintNodeSummary writes the node's GPUs and their uses.
func PrintNodeSummary(w io.Writer, node string, gpus []GPUUse) {
	used := 0
	for _, g := range gpus {
		if len(g.Uses) > 0 {
			used++
		}
	}
	fmt.Fprintf(w, "  node %s: %d of %d GPUs in use\n", node, used, len(gpus))
	for _, g := range gpus {
		if len(g.Uses) == 0 {
			fmt.Fprintf(w, "    gpu-%d %s: free\n", g.Minor, g.Product)
			continue
		}
		for i, u := range g.Uses {
			prefix := fmt.Sprintf("gpu-%d %s:", g.Minor, g.Product)
			if i > 0 {
				prefix = strings.Repeat(" ", len(prefix))
			}
			fmt.Fprintf(w, "    %s %s\n", prefix, u)
		}
	}
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}
