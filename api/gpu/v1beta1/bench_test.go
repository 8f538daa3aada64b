package v1beta1

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// worstCases are configs of at most MaxConfigBytes built to be as costly as
// possible for each step of DecodeDefaultValidate: deep nesting (the
// structure the decoder recurses on), many keys and long arrays (the
// number of tokens), and YAML aliases (expansion).
func worstCases() map[string][]byte {
	const head = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{`
	const tail = `}}}`
	// fill nests open…close around "1" as deep as the size limit allows.
	fill := func(prefix, open, close, suffix string) []byte {
		n := (MaxConfigBytes - len(prefix) - len(suffix) - 1) / (len(open) + len(close))
		return []byte(prefix + strings.Repeat(open, n) + "1" + strings.Repeat(close, n) + suffix)
	}
	repeatTo := func(prefix, item, suffix string) []byte {
		n := (MaxConfigBytes - len(prefix) - len(suffix)) / len(item)
		s := prefix + strings.Repeat(item, n)
		return []byte(strings.TrimSuffix(s, ",") + suffix)
	}
	var manyKeys strings.Builder
	manyKeys.WriteString(head)
	for i := 0; manyKeys.Len() < MaxConfigBytes-40; i++ {
		fmt.Fprintf(&manyKeys, `"k%d":1,`, i)
	}
	var perDevice strings.Builder
	perDevice.WriteString(head + `"defaultPinnedDeviceMemoryLimit":"1Gi","defaultPerDevicePinnedMemoryLimit":{`)
	for i := range maxDevicesPerConfig {
		fmt.Fprintf(&perDevice, `"GPU-%08x-0000-0000-0000-000000000000":"%dMi",`, i, 1024+i)
	}
	yamlHead := "apiVersion: gpu.dra.dev/v1beta1\nkind: GpuConfig\nsharing:\n  strategy: MPS\n  mpsConfig:\n    x: "
	// Billion laughs, kept under yaml.v2's own alias limit (which allows
	// 99 expanded nodes per written one) by plain padding before it.
	laughs := "a0: &a0 [" + strings.Repeat(strings.Repeat("x", 100)+",", 9) + "x]\n"
	for i := 1; i < 5; i++ {
		laughs += fmt.Sprintf("a%d: &a%d [%s*a%d]\n", i, i, strings.Repeat(fmt.Sprintf("*a%d,", i-1), 8), i-1)
	}
	var aliases strings.Builder
	aliases.WriteString("apiVersion: gpu.dra.dev/v1beta1\nkind: GpuConfig\np: [")
	for aliases.Len() < MaxConfigBytes-len(laughs)-3 {
		aliases.WriteString("0,")
	}
	aliases.WriteString("0]\n" + laughs)
	return map[string][]byte{
		"json-deep-arrays":         fill(head+`"x":`, "[", "]", tail),
		"json-deep-objects":        fill(head+`"x":`, `{"a":`, "}", tail),
		"json-many-keys":           []byte(strings.TrimSuffix(manyKeys.String(), ",") + tail),
		"json-long-array":          repeatTo(head+`"x":[`, "1,", "]"+tail),
		"json-valid-32-per-device": []byte(strings.TrimSuffix(perDevice.String(), ",") + "}" + tail),
		"yaml-deep-flow":           fill(yamlHead, "[", "]", "\n"),
		"yaml-deep-block":          fill(yamlHead+"\n    ", "- ", "", "\n"),
		"yaml-aliases":             []byte(aliases.String()),
		"yaml-long-list":           repeatTo(yamlHead+"[", "0,", "]\n"),
	}
}

// BenchmarkDecodeWorstCase measures DecodeDefaultValidate on each worst
// case: time and allocation must stay linear in the size, whatever the
// structure (docs/performance.md has the figures).
//
//	go test ./api/gpu/v1beta1 -run '^$' -bench DecodeWorstCase
func BenchmarkDecodeWorstCase(b *testing.B) {
	cases := worstCases()
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		data := cases[name]
		if len(data) > MaxConfigBytes {
			b.Fatalf("%s: %d bytes, more than MaxConfigBytes", name, len(data))
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				_, _ = DecodeDefaultValidate(data)
			}
		})
	}
}

// TestDecodeWorstCaseAllocation bounds what DecodeDefaultValidate allocates
// for each worst case: a deeply nested config once cost hundreds of
// megabytes (a copy of the path per level). Allocation, unlike time, does
// not depend on the machine's load.
func TestDecodeWorstCaseAllocation(t *testing.T) {
	const runs = 5
	for name, data := range worstCases() {
		// JSON is what the API server stores and sends; YAML configs come
		// from files and cost more per node in the YAML parser.
		limit := uint64(1 << 20)
		if strings.HasPrefix(name, "yaml") {
			limit = 4 << 20
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			_, _ = DecodeDefaultValidate(data)
		}
		runtime.ReadMemStats(&after)
		if perRun := (after.TotalAlloc - before.TotalAlloc) / runs; perRun > limit {
			t.Errorf("%s: DecodeDefaultValidate allocates %d bytes per run, more than %d", name, perRun, limit)
		}
	}
}
