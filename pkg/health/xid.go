package health

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// DefaultIgnoredXIDs are the XIDs that do not make a GPU unhealthy unless
// configured otherwise: errors NVIDIA attributes to the application (bad
// memory access, a faulting kernel, a channel torn down after such an
// error), after which the GPU keeps working. docs/health.md gives the reason
// for each default, and for the notable XIDs that are not ignored.
var DefaultIgnoredXIDs = []uint64{
	13, // Graphics Engine Exception: usually a faulting kernel (e.g. out-of-range access).
	31, // GPU memory page fault: an illegal address of the application.
	43, // GPU stopped processing: the channel of a failed application was stopped.
	45, // Preemptive cleanup: channels torn down after a previous error or a killed process.
	68, // Video processor (NVDEC) exception: the decoding application's input or use.
}

// DefaultGPUWideXIDs are XIDs that mark the whole GPU unhealthy even when
// NVML attributes them to one MIG instance: they concern hardware the MIG
// instances share (memory rows, NVLink, the PCIe link, the GSP firmware).
// Other XIDs attributed to a MIG instance mark only that instance.
var DefaultGPUWideXIDs = []uint64{48, 63, 64, 74, 79, 92, 95, 119, 120}

// xidDescriptions are NVIDIA's names of the XIDs this package mentions.
var xidDescriptions = map[uint64]string{
	13:  "graphics engine exception",
	31:  "GPU memory page fault",
	43:  "GPU stopped processing",
	45:  "preemptive cleanup, due to previous errors",
	48:  "double-bit ECC error",
	63:  "ECC page retirement or row remapping recording event",
	64:  "ECC page retirement or row remapper recording failure",
	68:  "video processor exception",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	109: "context switch timeout",
	119: "GSP RPC timeout",
	120: "GSP error",
}

func xidDescription(n uint64) string { return xidDescriptions[n] }

// ParseXIDs parses a comma-separated list of XID numbers, as a flag gives
// it ("13,31,43"). Spaces are allowed; the empty string is an empty list.
func ParseXIDs(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("invalid XID %q: want a decimal number", f)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// FormatXIDs is the inverse of ParseXIDs, for flag defaults and logs.
func FormatXIDs(xids []uint64) string {
	parts := make([]string, len(xids))
	for i, x := range xids {
		parts[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(parts, ",")
}

func xidSet(xids []uint64) map[uint64]bool {
	set := make(map[uint64]bool, len(xids))
	for _, x := range xids {
		set[x] = true
	}
	return set
}
