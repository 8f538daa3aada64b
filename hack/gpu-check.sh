#!/usr/bin/env bash
# The read-only hardware check (docs/hardware.md): the driver's own code
# paths on a node's real GPUs, compared with the simulation.
#
#   hack/gpu-check.sh build   build the carried bundle into .gpu-check/ (here: needs Go)
#   hack/gpu-check.sh run     run the carried bundle and write the report under $OUT
#                             (on the device machine: no Go, runs as root, bare host);
#                             extra arguments go to gpu-check (e.g. --simulate=dgxh200)
#   hack/gpu-check.sh sim     dry run of `run` as the device tool would do it: the working
#                             tree and .gpu-check/ copied elsewhere, no Go on PATH, a
#                             simulated H200 and driver root, $OUT checked against the
#                             tool's limits (make gpu-check-sim, part of make check)
#
# On the device machine: run with carry [".gpu-check"] and the command
# `bash hack/gpu-check.sh run`. It changes no GPU setting: gpu-check puts
# NVML behind a guard that refuses every setter, and nvidia-smi is only
# asked to list.
set -euo pipefail
cd "$(dirname "$0")/.."

bundle=.gpu-check
# The device tool's limits: 64 MiB carried; 8 files of 16 MiB come back.
max_bundle=$((60 << 20))
max_files=8
max_file=$((16 << 20))

build() {
	export CGO_ENABLED=1 GOOS=linux GOARCH=amd64
	export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
	mkdir -p "$bundle"
	local tmp
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' RETURN
	# cgo only for go-nvml, which dlopens libnvidia-ml at run time: the
	# binary needs nothing but glibc (ldd: libc, ld-linux).
	# No -trimpath: the same compile cache as make build and the tests.
	go build -ldflags "-s -w" -o "$tmp/gpu-check" ./cmd/gpu-check
	# The stripped binary is ~80 MB, over the carry limit; gzip'd ~21 MB.
	gzip -9 -c "$tmp/gpu-check" >"$bundle/gpu-check.gz.tmp"
	mv "$bundle/gpu-check.gz.tmp" "$bundle/gpu-check.gz"
	{
		echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with local changes)')"
		echo "built: $(date -u +%FT%TZ) with $(go version | cut -d' ' -f3)"
		echo "needs: $(ldd "$tmp/gpu-check" | awk '{print $1}' | tr '\n' ' ')"
		if command -v objdump >/dev/null; then
			echo "glibc: at least $(objdump -T "$tmp/gpu-check" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
		fi
	} >"$bundle/BUILD"
	local size
	size=$(du -sb "$bundle" | cut -f1)
	if ((size > max_bundle)); then
		echo "gpu-check: bundle $bundle is $size bytes, over the $max_bundle the device tool carries" >&2
		exit 1
	fi
	echo "gpu-check: bundle $bundle ($size bytes) ready; $(grep commit "$bundle/BUILD")" >&2
}

run() {
	: "${OUT:?set OUT to the folder the report goes to}"
	[[ -f $bundle/gpu-check.gz ]] || {
		echo "gpu-check: no $bundle/gpu-check.gz; build it first (hack/gpu-check.sh build) and carry $bundle" >&2
		exit 1
	}
	local start tmp rc=0 simulate=false
	start=$(date +%s)
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' RETURN
	mkdir -p "$OUT"
	if command -v gzip >/dev/null; then
		gzip -dc "$bundle/gpu-check.gz" >"$tmp/gpu-check"
	else
		python3 -c 'import gzip,shutil,sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$bundle/gpu-check.gz" "$tmp/gpu-check"
	fi
	chmod +x "$tmp/gpu-check"
	[[ -f $bundle/BUILD ]] && sed 's/^/gpu-check: bundle /' "$bundle/BUILD"
	for a in "$@"; do [[ $a == --simulate=* ]] && simulate=true; done

	if ! $simulate && command -v nvidia-smi >/dev/null; then
		# Queries only; nvidia-smi is not part of the comparison, it is
		# what a person compares the report with.
		{
			timeout 30 nvidia-smi -q || true
			echo "=== nvidia-smi mig -lgip"
			timeout 30 nvidia-smi mig -lgip || true
			echo "=== nvidia-smi mig -lgipp"
			timeout 30 nvidia-smi mig -lgipp || true
		} >"$OUT/nvidia-smi.txt" 2>&1
	fi
	# 4 minutes for the check itself, then a hard stop: the whole run
	# stays under 5.
	timeout -k 10 270 "$tmp/gpu-check" --out="$OUT" --device-policy=hack/gpu-check-policy.yaml --deadline=4m "$@" \
		2>"$OUT/gpu-check.log" || rc=$?
	if (($(stat -c %s "$OUT/gpu-check.log") > max_file / 2)); then
		tail -c $((max_file / 2)) "$OUT/gpu-check.log" >"$tmp/log" && mv "$tmp/log" "$OUT/gpu-check.log"
	fi
	if [[ -f $OUT/gpu-check-report.md ]]; then
		sed -n '/^## Findings/,/^## Read-only guard/p' "$OUT/gpu-check-report.md" | head -60
	else
		tail -20 "$OUT/gpu-check.log"
	fi
	echo "gpu-check: exit $rc after $(($(date +%s) - start))s; report in $OUT: $(find "$OUT" -mindepth 1 -maxdepth 1 -printf '%f ')"
	return "$rc"
}

# sim proves the device machine's layout: only what the device tool
# carries (the working tree git does not ignore, plus .gpu-check), no Go.
sim() {
	local root out
	root=$(mktemp -d)
	out=$(mktemp -d)
	trap 'rm -rf "$root" "$out"' RETURN
	git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
		[[ -e $f ]] && printf '%s\0' "$f"
	done | tar --null -T - -cf - | tar -xf - -C "$root"
	cp -r "$bundle" "$root/"
	local path=/usr/sbin:/usr/bin:/sbin:/bin
	if PATH=$path command -v go >/dev/null; then
		echo "gpu-check sim: go is on $path; the dry run would not prove the bundle runs without it" >&2
		exit 1
	fi
	(cd "$root" && env -i PATH=$path HOME="$root" OUT="$out" bash hack/gpu-check.sh run --simulate=dgxh200 --expect-clean "$@")
	local n=0 f
	for f in "$out"/*; do
		n=$((n + 1))
		if [[ ! -f $f ]]; then
			echo "gpu-check sim: $f is not a plain file; the device tool would not return it" >&2
			exit 1
		fi
		if (($(stat -c %s "$f") > max_file)); then
			echo "gpu-check sim: $f is over $max_file bytes; the device tool would not return it" >&2
			exit 1
		fi
	done
	if ((n > max_files)); then
		echo "gpu-check sim: $n files in OUT, the device tool returns $max_files" >&2
		exit 1
	fi
	for f in gpu-check-report.md gpu-check-report.json slices-default.yaml slices-policy.yaml gpu-check.log; do
		[[ -s $out/$f ]] || {
			echo "gpu-check sim: OUT lacks $f" >&2
			exit 1
		}
	done
	echo "gpu-check sim: the carried bundle ran without Go and wrote $n files within the device tool's limits"
}

case "${1:-}" in
build) build ;;
run) shift && run "$@" ;;
sim) shift && sim "$@" ;;
*)
	sed -n '2,17p' "$0" >&2
	exit 2
	;;
esac
