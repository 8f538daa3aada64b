package kubectlgpu

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// formatBytes shows a memory quantity in binary units with one decimal:
// 81559Mi is "79.6Gi".
func formatBytes(q resource.Quantity) string {
	if q.IsZero() {
		return "-"
	}
	b := float64(q.Value())
	for _, u := range []struct {
		name string
		size float64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if b >= u.size {
			return strings.TrimSuffix(strconv.FormatFloat(b/u.size, 'f', 1, 64), ".0") + u.name
		}
	}
	return strconv.FormatInt(q.Value(), 10)
}

// formatCapacity shows consumed or published capacity: shares, compute and
// memory first, then the rest by name.
func formatCapacity(m map[string]resource.Quantity) string {
	order := []string{vocabulary.CapacityShares, vocabulary.CapacityCompute, vocabulary.CapacityMemory}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !slices.Contains(order, k) {
			order = append(order, k)
		}
	}
	var parts []string
	for _, k := range order {
		q, ok := m[k]
		if !ok {
			continue
		}
		switch k {
		case vocabulary.CapacityCompute:
			parts = append(parts, fmt.Sprintf("compute %d%%", q.Value()))
		case vocabulary.CapacityMemory:
			parts = append(parts, "memory "+formatBytes(q))
		default:
			parts = append(parts, k+" "+q.String())
		}
	}
	return strings.Join(parts, ", ")
}

// formatUsage shows how a GPU is used: "free", "whole",
// "mig 1g.10gb×2,3g.40gb", "timeslice 2/4 (compute 50%, memory 39.8Gi)",
// "passthrough (default/vm)". Wide adds the claims (all of them, so a
// passthrough claim is not named twice).
func formatUsage(u Usage, wide bool) string {
	var parts []string
	if len(u.Passthrough) > 0 {
		p := "passthrough"
		if !wide {
			p += " (" + strings.Join(u.Passthrough, " ") + ")"
		}
		parts = append(parts, p)
	}
	if u.Whole {
		parts = append(parts, "whole")
	}
	if len(u.MIG) > 0 {
		var profiles []string
		for _, p := range u.MIG {
			s := p.Profile
			if p.Count > 1 {
				s += fmt.Sprintf("×%d", p.Count)
			}
			profiles = append(profiles, s)
		}
		parts = append(parts, "mig "+strings.Join(profiles, ","))
	}
	for _, s := range u.Shares {
		parts = append(parts, fmt.Sprintf("%s %d/%d (compute %d%%, memory %s)", s.Type, s.Used, s.Allowed, s.ComputePercent, formatBytes(s.Memory)))
	}
	if len(parts) == 0 {
		parts = []string{u.State}
	}
	out := strings.Join(parts, " + ")
	if wide && len(u.Claims) > 0 {
		out += " [" + strings.Join(u.Claims, " ") + "]"
	}
	return out
}

// formatDevice shows an allocated device and what it is:
// "gpu-0-ts (timeslice: shares 1, compute 25%, memory 19.9Gi)".
func formatDevice(a Allocation) string {
	var what string
	switch a.Type {
	case "":
		what = "not published"
	case vocabulary.KindGPU:
		what = "whole"
	case vocabulary.KindMIG:
		what = "mig " + a.Profile
	case vocabulary.KindVFIO:
		what = "passthrough"
	default:
		what = string(a.Type)
		if c := formatCapacity(a.Consumed); c != "" {
			what += ": " + c
		}
	}
	if a.AdminAccess {
		what += ", admin access"
	}
	return fmt.Sprintf("%s (%s)", a.Device, what)
}

func formatModels(models []ModelCount) string {
	var parts []string
	for _, m := range models {
		parts = append(parts, fmt.Sprintf("%d× %s", m.Count, m.ProductName))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// formatPlacements shows placement starts compactly: 0,1,2,3 is "0-3".
func formatPlacements(p []int64) string {
	var parts []string
	for i := 0; i < len(p); {
		j := i
		for j+1 < len(p) && p[j+1] == p[j]+1 {
			j++
		}
		if j-i >= 2 {
			parts = append(parts, fmt.Sprintf("%d-%d", p[i], p[j]))
		} else {
			for k := i; k <= j; k++ {
				parts = append(parts, strconv.FormatInt(p[k], 10))
			}
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

func formatPods(pods []PodRef, wide bool) string {
	var parts []string
	for _, p := range pods {
		s := p.Name
		if !p.Reserved {
			s += " (not reserved)"
		} else if wide && p.Phase != "" {
			s += " (" + p.Phase + ")"
		}
		parts = append(parts, s)
	}
	return orDash(strings.Join(parts, ", "))
}

func formatTaints(taints []Taint) string {
	var parts []string
	for _, t := range taints {
		parts = append(parts, t.String())
	}
	return strings.Join(parts, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
