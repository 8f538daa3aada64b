# shellcheck shell=bash disable=SC2034 # variables are used by the scripts that source this
# Shared settings for hack/cluster/*.sh. Sourced, not executed.

# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

GDD_TOOLS_DIR=$GDD_REPO_ROOT/hack/tools
GDD_K8S_VERSION=v1.37.2
GDD_CONTAINERD_VERSION=v2.4.2

# Where binaries are cached (outside the clone, shared by all clones of the repo).
GDD_CACHE_ROOT=${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver}

# gdd_cache_key hashes everything that decides the cached binaries: both tool
# modules' go.sum and the build script itself. Any edit of build.sh, even a
# comment, means a cold build (~26 min on 2 cores) on every machine: keep
# helpers it could share in this file (not hashed) and edit it only for a
# build change. (Its --help stays a copy of gdd_usage for that reason.)
gdd_cache_key() {
	cat "$GDD_TOOLS_DIR/go.sum" "$GDD_TOOLS_DIR/helm/go.sum" "$GDD_REPO_ROOT/hack/cluster/build.sh" |
		sha256sum | cut -c1-12
}

GDD_CLUSTER_CACHE=$GDD_CACHE_ROOT/cluster-$GDD_K8S_VERSION-$(gdd_cache_key)
GDD_BIN=$GDD_CLUSTER_CACHE/bin
GDD_IMAGES=$GDD_CLUSTER_CACHE/images

# Image references of the images built by build.sh and imported by up.sh.
GDD_PAUSE_IMAGE=gdd.local/pause:v1
GDD_DEMO_IMAGE=gdd.local/demo:v1
