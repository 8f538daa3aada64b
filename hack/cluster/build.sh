#!/usr/bin/env bash
# Builds, once, everything the local single-node cluster runs and caches it outside
# the clone:
#
#   ${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver}/cluster-v1.37.2-<key>/
#     bin/     etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl
#              containerd containerd-shim-runc-v2 ctr helm mkimage pause
#     images/  pause.tar demo.tar (OCI layout tars for `ctr images import`)
#
# <key> hashes hack/tools/go.sum, hack/tools/helm/go.sum and this script, so a
# dependency bump or a build change gets a fresh directory. Binaries that exist are
# skipped; the small tools of this repo (etcd, mkimage, pause) are rebuilt when
# their source changes. A warm run takes seconds.
#
# Usage: hack/cluster/build.sh [--force] [--no-apt] [--print-bin-dir]
#   --force          rebuild every binary
#   --no-apt         do not install missing Debian packages
#   --print-bin-dir  print the bin directory and exit (builds nothing)
# Environment: GPU_DRA_CACHE (cache root), GOCACHE/GOMODCACHE/GOPROXY as for go.
set -euo pipefail

# shellcheck source=hack/cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

force=false
apt=true
for arg in "$@"; do
	case $arg in
	--force) force=true ;;
	--no-apt) apt=false ;;
	--print-bin-dir)
		echo "$GDD_BIN"
		exit 0
		;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*) gdd_die "unknown argument $arg (see --help)" ;;
	esac
done

# Debian packages the cluster needs at run time (and busybox for the demo image).
install_packages() {
	local missing=()
	command -v runc >/dev/null || missing+=(runc)
	dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
	[[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
	command -v openssl >/dev/null || missing+=(openssl)
	command -v ip >/dev/null || missing+=(iproute2)
	command -v iptables >/dev/null || missing+=(iptables)
	((${#missing[@]})) || return 0
	$apt || gdd_die "missing Debian packages: ${missing[*]} (run without --no-apt, as root)"
	[[ $(id -u) == 0 ]] || gdd_die "missing Debian packages: ${missing[*]}; install them as root"
	gdd_log "apt-get install ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# heartbeat prints "still building" lines while a long step runs, so CI logs show life.
heartbeat_pid=
start_heartbeat() {
	local what=$1 since
	since=$(date +%s)
	(
		while sleep 60; do
			gdd_log "  ... still building $what ($(gdd_fmt_duration $(($(date +%s) - since))))"
		done
	) &
	heartbeat_pid=$!
}
stop_heartbeat() {
	if [[ -n $heartbeat_pid ]]; then
		kill "$heartbeat_pid" 2>/dev/null || true
		wait "$heartbeat_pid" 2>/dev/null || true # 143: it was terminated
	fi
	heartbeat_pid=
}
trap stop_heartbeat EXIT

# src_hash NAME DIR...: a stamp of the Go sources of this repo's own tools.
src_hash() {
	find "$@" -name '*.go' -type f -print0 | sort -z | xargs -0 cat | cat - "$GDD_TOOLS_DIR/go.sum" | sha256sum | cut -c1-16
}

# step DIR NAME STAMP CMD...: unless DIR/NAME exists with the same stamp, runs CMD
# (which writes NAME and any companions into $tmp) and moves its outputs into DIR.
built=0
step() {
	local dir=$1 name=$2 stamp=$3
	shift 3
	if ! $force && [[ -f $dir/$name && $(cat "$dir/.$name.stamp" 2>/dev/null) == "$stamp" ]]; then
		return 0
	fi
	local t0 f
	t0=$(date +%s)
	gdd_log "building $name"
	start_heartbeat "$name"
	rm -rf "$tmp" && mkdir -p "$tmp"
	if ! "$@"; then
		stop_heartbeat
		gdd_die "building $name failed"
	fi
	stop_heartbeat
	for f in "$tmp"/*; do
		mv -f "$f" "$dir/"
		echo "$stamp" >"$dir/.$(basename "$f").stamp"
	done
	built=$((built + 1))
	gdd_log "built $name in $(gdd_fmt_duration $(($(date +%s) - t0)))"
}

k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$GDD_K8S_VERSION \
-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 \
-X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/client-go/pkg/version.gitVersion=$GDD_K8S_VERSION \
-X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=37"

gobuild() { # gobuild DIR OUT PKG [go build flags...]
	local dir=$1 out=$2 pkg=$3
	shift 3
	(cd "$dir" && CGO_ENABLED=0 nice -n 19 go build -trimpath "$@" -o "$tmp/$out" "$pkg")
}

build_kube() { gobuild "$GDD_TOOLS_DIR" "$1" "k8s.io/kubernetes/cmd/$1" -ldflags "$k8s_ldflags"; }

build_containerd() {
	local m=github.com/containerd/containerd/v2
	GOBIN=$tmp CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 19 go install -trimpath \
		-ldflags "-s -w -X $m/version.Version=$GDD_CONTAINERD_VERSION -X $m/version.Revision=release" \
		"$m/cmd/containerd@$GDD_CONTAINERD_VERSION" "$m/cmd/containerd-shim-runc-v2@$GDD_CONTAINERD_VERSION" \
		"$m/cmd/ctr@$GDD_CONTAINERD_VERSION"
}

build_helm() {
	local v
	v=$(cd "$GDD_TOOLS_DIR/helm" && go list -m -f '{{.Version}}' helm.sh/helm/v3)
	gobuild "$GDD_TOOLS_DIR/helm" helm helm.sh/helm/v3/cmd/helm \
		-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$v"
}

# build_image NAME REF MKIMAGE-ARGS...: images live next to the binaries.
build_image() {
	local name=$1 ref=$2
	shift 2
	"$GDD_BIN/mkimage" -ref "$ref" -o "$tmp/$name.tar" "$@"
}

main() {
	install_packages
	mkdir -p "$GDD_BIN" "$GDD_IMAGES"
	exec 9>"$GDD_CLUSTER_CACHE/.lock"
	flock 9 # one build per cache directory at a time
	tmp=$GDD_CLUSTER_CACHE/.tmp

	gdd_log "cache $GDD_CLUSTER_CACHE"
	local k b=$GDD_BIN
	for k in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
		step "$b" "$k" "$GDD_K8S_VERSION" build_kube "$k"
	done
	step "$b" etcd "$(src_hash "$GDD_TOOLS_DIR/cmd/etcd")" gobuild "$GDD_TOOLS_DIR" etcd ./cmd/etcd -ldflags "-s -w"
	step "$b" containerd "$GDD_CONTAINERD_VERSION" build_containerd
	step "$b" helm "$(sha256sum <"$GDD_TOOLS_DIR/helm/go.sum" | cut -c1-16)" build_helm
	step "$b" mkimage "$(src_hash "$GDD_TOOLS_DIR/cmd/mkimage")" gobuild "$GDD_TOOLS_DIR" mkimage ./cmd/mkimage -ldflags "-s -w"
	step "$b" pause "$(src_hash "$GDD_TOOLS_DIR/cmd/pause")" gobuild "$GDD_TOOLS_DIR" pause ./cmd/pause -ldflags "-s -w"

	# Images, keyed on their inputs.
	local pause_stamp demo_stamp
	pause_stamp=$(cat "$b/.pause.stamp" "$b/.mkimage.stamp" | sha256sum | cut -c1-16)
	demo_stamp=$( (sha256sum </bin/busybox && cat "$b/.mkimage.stamp") | sha256sum | cut -c1-16)
	step "$GDD_IMAGES" pause.tar "$pause_stamp" \
		build_image pause "$GDD_PAUSE_IMAGE" -file "$b/pause:/pause" -entrypoint /pause
	step "$GDD_IMAGES" demo.tar "$demo_stamp" \
		build_image demo "$GDD_DEMO_IMAGE" -busybox /bin/busybox -cmd sh
	rm -rf "$tmp"

	if ((built)); then
		gdd_log "built $built item(s); binaries in $GDD_BIN"
	else
		gdd_log "up to date: $GDD_BIN"
	fi
}

main
