#!/usr/bin/env bash
# make bench: the Go benchmarks, no cluster: the device model and the plugin over
# the kubelet stand-in's sockets (pkg/devicemodel, test/node), the plugin's memory
# (test/crash BenchmarkRSS), one metrics scrape of 8 GPUs and 32 pods (pkg/telemetry
# BenchmarkScrape: NVML calls and cgroup reads per scrape) and the slice size of each simulated machine, printed as
# one table. Pod start latency and scheduler throughput on a real local cluster are
# hack/demo/bench-cluster.sh's. Record the figures, with the machine they ran on,
# in docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
out=$(mktemp)
trap 'rm -f "$out"' EXIT

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(go version | cut -d' ' -f3)" >&2
go test -run='^$' -bench=. -benchtime="${BENCHTIME:-300x}" ./pkg/devicemodel ./pkg/telemetry ./test/node 2>/dev/null | grep '^Benchmark' >>"$out"
go test -run='^$' -bench=RSS -benchtime=3x ./test/crash 2>/dev/null | grep '^Benchmark' >>"$out"

printf '%-58s %14s %s\n' "benchmark" "ns/op" "metrics"
awk '{m=""; for (i=5; i<NF; i+=2) m=m sprintf("%s=%s ", $(i+1), $i); printf "%-58s %14s %s\n", $1, $3, m}' "$out"

echo
printf '%-10s %12s %8s\n' "machine" "slice-bytes" "devices"
for m in dgxa100 dgxh100 dgxh200 dgxb200 l4x4; do
	y=$(./bin/dra-kubelet-plugin --simulate="$m" --node-name=node-1 --print-slices 2>/dev/null)
	printf '%-10s %12s %8s\n' "$m" "$(printf '%s' "$y" | wc -c)" "$(printf '%s\n' "$y" | grep -cE '^    name: (gpu|mig|ts|mps)-')"
done
