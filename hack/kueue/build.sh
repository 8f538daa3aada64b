#!/usr/bin/env bash
# Builds, once, the Kueue manager (sigs.k8s.io/kueue/cmd/kueue, from the Go module
# pinned in hack/tools/kueue/go.mod) and copies its CRDs and webhook configurations
# out of the module zip:
#
#   ${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver}/kueue-<version>-<key>/
#     bin/kueue   config/crds/*.yaml   config/webhooks.yaml
#
# <key> hashes hack/tools/kueue/go.sum and this script. A warm run takes a second.
#
# Usage: hack/kueue/build.sh [--force] [--print-dir]
#   --force      rebuild
#   --print-dir  print the cache directory (bin/, config/) and exit (builds nothing)
# Environment: GPU_DRA_CACHE (cache root), GOCACHE/GOMODCACHE/GOPROXY as for go.
set -euo pipefail

# shellcheck source=hack/kueue/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

force=false
for arg in "$@"; do
	case $arg in
	--force) force=true ;;
	--print-dir)
		echo "$GDD_KUEUE_CACHE"
		exit 0
		;;
	-h | --help)
		gdd_usage
		exit 0
		;;
	*) gdd_die "unknown argument $arg (see --help)" ;;
	esac
done

[[ -n $GDD_KUEUE_VERSION ]] || gdd_die "no sigs.k8s.io/kueue requirement in $GDD_KUEUE_MODULE_DIR/go.mod"
mkdir -p "$GDD_KUEUE_CACHE"
exec 9>"$GDD_KUEUE_CACHE/.lock"
flock 9 # one build per cache directory at a time

if ! $force && [[ -x $GDD_KUEUE_BIN && -f $GDD_KUEUE_CONFIG/.done ]]; then
	gdd_log "up to date: $GDD_KUEUE_BIN"
	exit 0
fi

tmp=$GDD_KUEUE_CACHE/.tmp
rm -rf "$tmp" && mkdir -p "$tmp/config/crds"
t0=$(date +%s)
gdd_log "building kueue $GDD_KUEUE_VERSION (cold: many minutes on 2 cores)"
(
	# The trap ends the sleep too, so no child keeps a caller's pipe open.
	trap 'kill $! 2>/dev/null; exit 0' TERM
	while :; do
		sleep 60 &
		wait $!
		gdd_log "  ... still building kueue ($(gdd_fmt_duration $(($(date +%s) - t0))))"
	done
) &
beat=$!
trap 'kill $beat 2>/dev/null || true' EXIT
cd "$GDD_KUEUE_MODULE_DIR"
CGO_ENABLED=0 nice -n 19 go build -trimpath \
	-ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$GDD_KUEUE_VERSION" \
	-o "$tmp/kueue" sigs.k8s.io/kueue/cmd/kueue
moddir=$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
[[ -d $moddir/config/components/crd/bases ]] || gdd_die "no CRDs under $moddir/config/components/crd/bases"
cp "$moddir"/config/components/crd/bases/*.yaml "$tmp/config/crds/"
cp "$moddir/config/components/webhook/manifests.yaml" "$tmp/config/webhooks.yaml"
chmod -R u+w "$tmp/config"
kill "$beat" 2>/dev/null || true

mkdir -p "$(dirname "$GDD_KUEUE_BIN")"
rm -rf "$GDD_KUEUE_CONFIG"
mv "$tmp/config" "$GDD_KUEUE_CONFIG"
touch "$GDD_KUEUE_CONFIG/.done"
mv -f "$tmp/kueue" "$GDD_KUEUE_BIN"
rm -rf "$tmp"
gdd_log "built kueue in $(gdd_fmt_duration $(($(date +%s) - t0))): $GDD_KUEUE_BIN"
