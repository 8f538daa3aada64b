#!/usr/bin/env bash
# Builds the upstream allocator change of docs/upstream-allocator.md, outside the
# product: k8s.io/dynamic-resource-allocation v0.37.2 from the Go module cache with
# hack/upstream-allocator/0001-*.patch applied, upstream's own tests of the patched
# packages run on it, and a kube-scheduler v1.37.2 built from the hack/tools module
# (the cluster's kube-scheduler, hack/cluster/build.sh) with a replace to the patched
# copy, through a copy of its go.mod (-modfile): hack/tools/go.mod and the product's
# go.mod stay as they are.
#
#   ${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver}/upstream-allocator-v0.37.2-<key>/
#     src/        the patched module
#     test.log    upstream's tests of the patched module (go test ./structured/... ./cel/...)
#     tools.mod   hack/tools/go.mod with the replace (and tools.sum)
#     product.mod the product's go.mod with the replace (and product.sum), for bench.sh
#     bin/        kube-scheduler
#
# <key> hashes the patch, this script and hack/tools/go.sum. Steps that are done
# are skipped. The kube-scheduler build is long on a small machine (most packages
# come from the Go build cache when hack/cluster/build.sh ran before).
#
# Usage: hack/upstream-allocator/build.sh [--no-test] [--no-scheduler] [--print-bin-dir] [--print-dir]
#   --no-test        do not run upstream's tests
#   --no-scheduler   do not build kube-scheduler
#   --print-bin-dir  print the directory of the patched kube-scheduler and exit
#   --print-dir      print the cache directory and exit
# The churn bench with the patched scheduler:
#   GDD_SCHEDULER_BIN_DIR=$(hack/upstream-allocator/build.sh --print-bin-dir) hack/demo/bench-cluster.sh ...
set -euo pipefail

# shellcheck source=hack/cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/lib.sh"

here=$GDD_REPO_ROOT/hack/upstream-allocator
dra_module=k8s.io/dynamic-resource-allocation
dra_version=v0${GDD_K8S_VERSION#v1} # v1.37.2 -> v0.37.2
patches=("$here"/0*.patch)
key=$(cat "${patches[@]}" "$here/build.sh" "$GDD_TOOLS_DIR/go.sum" | sha256sum | cut -c1-12)
dir=$GDD_CACHE_ROOT/upstream-allocator-$dra_version-$key

test=true
scheduler=true
for arg in "$@"; do
	case $arg in
	--no-test) test=false ;;
	--no-scheduler) scheduler=false ;;
	--print-bin-dir)
		echo "$dir/bin"
		exit 0
		;;
	--print-dir)
		echo "$dir"
		exit 0
		;;
	-h | --help)
		gdd_usage
		exit 0
		;;
	*) gdd_die "unknown argument $arg (see --help)" ;;
	esac
done

# The ldflags of hack/cluster/build.sh's kube-* binaries (not shared: any edit of
# that script means a cold cluster build).
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$GDD_K8S_VERSION \
-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 \
-X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/client-go/pkg/version.gitVersion=$GDD_K8S_VERSION \
-X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=37"

# patched_source copies the module from the module cache and applies the patches.
patched_source() {
	[[ -f $dir/src/.patched ]] && return 0
	local orig
	orig=$(cd "$GDD_TOOLS_DIR" && go mod download -json "$dra_module@$dra_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[[ -d $orig ]] || gdd_die "go mod download $dra_module@$dra_version gave no directory"
	rm -rf "$dir/src"
	cp -r "$orig" "$dir/src"
	chmod -R u+w "$dir/src"
	# A repository of its own, so that git apply works relative to it (and git diff
	# in src shows the change) wherever the cache lives.
	git -C "$dir/src" init -q
	git -C "$dir/src" add -A
	git -C "$dir/src" -c user.name=build.sh -c user.email=build.sh@localhost commit -qm "$dra_module $dra_version"
	local p
	for p in "${patches[@]}"; do
		gdd_log "applying $(basename "$p")"
		git -C "$dir/src" apply --whitespace=nowarn "$p" || gdd_die "$(basename "$p") does not apply to $dra_module@$dra_version"
	done
	touch "$dir/src/.patched"
}

# modfile NAME MODULE-DIR: MODULE-DIR's go.mod and go.sum, copied to $dir/NAME.mod
# and NAME.sum with the replace to the patched copy.
modfile() {
	cp "$2/go.mod" "$dir/$1.mod"
	cp "$2/go.sum" "$dir/$1.sum"
	(cd "$2" && go mod edit -modfile="$dir/$1.mod" -replace "$dra_module=$dir/src")
}

upstream_tests() {
	[[ -f $dir/.tested ]] && return 0
	gdd_log "running upstream's tests of the patched packages (log: $dir/test.log)"
	if ! (cd "$dir/src" && nice -n 10 go test -count=1 ./structured/... ./cel/...) >"$dir/test.log" 2>&1; then
		tail -n 40 "$dir/test.log" >&2
		gdd_die "upstream's tests fail on the patched module (log: $dir/test.log)"
	fi
	grep -E '^(ok|---|FAIL)' "$dir/test.log" >&2 || true
	touch "$dir/.tested"
}

build_scheduler() {
	[[ -x $dir/bin/kube-scheduler ]] && return 0
	local t0
	t0=$(date +%s)
	gdd_log "building kube-scheduler $GDD_K8S_VERSION with the patched $dra_module"
	mkdir -p "$dir/bin"
	(cd "$GDD_TOOLS_DIR" && CGO_ENABLED=0 nice -n 19 go build -modfile="$dir/tools.mod" -trimpath \
		-ldflags "$k8s_ldflags" -o "$dir/bin/kube-scheduler.tmp" k8s.io/kubernetes/cmd/kube-scheduler)
	mv "$dir/bin/kube-scheduler.tmp" "$dir/bin/kube-scheduler"
	gdd_log "built kube-scheduler in $(gdd_fmt_duration $(($(date +%s) - t0)))"
}

main() {
	mkdir -p "$dir"
	exec 9>"$dir/.lock"
	flock 9 # one build per cache directory at a time
	gdd_log "cache $dir"
	patched_source
	modfile tools "$GDD_TOOLS_DIR"
	modfile product "$GDD_REPO_ROOT"
	if $test; then
		upstream_tests
	fi
	if $scheduler; then
		build_scheduler
		gdd_log "patched kube-scheduler: $dir/bin/kube-scheduler"
	fi
}

main
