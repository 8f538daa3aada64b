#!/usr/bin/env bash
# Runs BenchmarkAllocatorCost (pkg/devicemodel, issue #14's allocator goal) against
# the released k8s.io/dynamic-resource-allocation v0.37.2 and against the patched
# copy of hack/upstream-allocator/build.sh: the same benchmark source, compiled
# twice, the second time with a copy of the product's go.mod that replaces the
# module by the patched copy (-modfile; go.mod itself is not changed). The two test
# binaries run in turns, ROUNDS times each, so load from other processes falls on
# both. Per fill level it prints the median call of each model in µs, averaged
# over the rounds, and the ratios: full model ÷ whole-GPU-only model (the goal's
# ratio) for each build, and patched ÷ unpatched for each model.
#
# The raw output stays in $(build.sh --print-dir)/bench; --summary prints the
# tables of the last run again without running anything.
#
# Usage: hack/upstream-allocator/bench.sh [--summary]
# Environment: BENCHTIME (200x), ROUNDS (2), BENCH (AllocatorCost).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

dir=$(hack/upstream-allocator/build.sh --print-dir)
hack/upstream-allocator/build.sh --no-test --no-scheduler # the patched copy and product.mod
out=$dir/bench # the raw output of the last run stays here

if [[ ${1:-} != --summary ]]; then
	rm -rf "$out"
	mkdir -p "$out"
	go test -c -o "$out/unpatched.test" ./pkg/devicemodel
	go test -c -mod=mod -modfile="$dir/product.mod" -o "$out/patched.test" ./pkg/devicemodel

	echo "machine: $(nproc) cores ($(sed -n 's/^model name\t: //p' /proc/cpuinfo | head -1)), $(free -g | awk '/Mem:/{print $2}') GiB, load $(cut -d' ' -f1-3 /proc/loadavg), $(go version | cut -d' ' -f3)" >"$out/machine"
	for round in $(seq "${ROUNDS:-2}"); do
		for build in unpatched patched; do
			echo "round $round: $build" >&2
			(cd pkg/devicemodel && "$out/$build.test" -test.run='^$' -test.bench="^Benchmark${BENCH:-AllocatorCost}\$" \
				-test.benchtime="${BENCHTIME:-200x}") | tee -a "$out/$build.out" | grep -E '^(Benchmark|    |--- )' >&2 || true
		done
	done
fi

cat "$out/machine"

# Each line: fill, then per metric (whole-only-us, gpu-x, ...) its value; averaged over rounds.
summary() {
	awk '/^BenchmarkAllocatorCost\/fill=/ {
		split($1, a, "fill="); fill = a[2]; sub(/-[0-9]+$/, "", fill)
		for (i = 5; i < NF; i += 2) { sum[fill, $(i+1)] += $i; n[fill, $(i+1)]++; names[$(i+1)] = 1 }
		fills[fill] = 1
	}
	END {
		for (f in fills) for (m in names) if (n[f, m]) printf "%s %s %.4f\n", f, m, sum[f, m] / n[f, m]
	}' "$1"
}
summary "$out/unpatched.out" | sed 's/^/u /' >"$out/all"
summary "$out/patched.out" | sed 's/^/p /' >>"$out/all"

echo
echo "BenchmarkAllocatorCost, one DGX H100 node, claim: one whole GPU; median call (µs) averaged over ${ROUNDS:-2} round(s) of each build."
echo "whole: whole-GPU-only model (8 devices); full: full model as published before withdrawal (224 devices);"
echo "full-w: full model after withdrawal of what the held GPUs make impossible (what a node publishes)."
awk '
	{ v[$1, $2, $3] = $4; fills[$2] = 1 }
	END {
		printf "%-4s | %-22s | %-22s | %-22s | %-18s | %-18s\n", "fill", "whole µs: unp. → pat.", "full µs: unp. → pat.", "full-w µs: unp. → pat.", "full÷whole: unp./pat.", "full-w÷whole: u./p."
		for (f = 0; f <= 8; f++) {
			if (!((f) in fills)) continue
			uw = v["u", f, "whole-only-us"]; pw = v["p", f, "whole-only-us"]
			ux = v["u", f, "gpu-x"]; px = v["p", f, "gpu-x"]
			uy = v["u", f, "gpu-w-x"]; py = v["p", f, "gpu-w-x"]
			printf "%-4d | %7.1f → %6.1f %5.2f× | %7.0f → %6.0f %5.2f× | %7.1f → %6.1f %5.2f× | %7.2f× / %6.2f× | %7.2f× / %6.2f×\n", f, uw, pw, pw / uw, uw * ux, pw * px, pw * px / (uw * ux), uw * uy, pw * py, pw * py / (uw * uy), ux, px, uy, py
			sw += pw / uw; sf += pw * px / (uw * ux); sy += pw * py / (uw * uy); n++
		}
		if (n) printf "mean | %22.2f× | %22.2f× | %22.2f× |\n", sw / n, sf / n, sy / n
	}' "$out/all"

echo
echo "full ÷ whole-GPU-only per claim kind, averaged over the fill levels (the goal's figure; -w: full model with withdrawal)"
printf '%-14s %10s %10s\n' kind unpatched patched
awk '
	{ if ($3 != "whole-only-us") { s[$1, $3] += $4; n[$1, $3]++; names[$3] = 1 } }
	END {
		for (m in names) printf "%-14s %9.2f× %9.2f×\n", m, s["u", m] / n["u", m], s["p", m] / n["p", m]
	}' "$out/all" | sort
