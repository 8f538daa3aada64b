# shellcheck shell=bash disable=SC2034 # variables are used by the scripts that source this
# Where the Kueue manager and its CRDs are cached (hack/kueue/build.sh) and what
# the local deployment (hack/kueue/deploy.sh) uses. Sourced, not executed.

# shellcheck source=hack/cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/lib.sh"

GDD_KUEUE_MODULE_DIR=$GDD_TOOLS_DIR/kueue
GDD_KUEUE_VERSION=$(sed -n 's/^\tsigs.k8s.io\/kueue \(v[^ ]*\).*/\1/p' "$GDD_KUEUE_MODULE_DIR/go.mod")

# The Kueue cache has its own key (its module's go.sum and build script), apart
# from the cluster's: a Kueue bump must not cost the ~26-minute cluster build,
# and a cluster change must not rebuild Kueue.
gdd_kueue_cache_key() {
	cat "$GDD_KUEUE_MODULE_DIR/go.sum" "$GDD_REPO_ROOT/hack/kueue/build.sh" | sha256sum | cut -c1-12
}
GDD_KUEUE_CACHE=$GDD_CACHE_ROOT/kueue-$GDD_KUEUE_VERSION-$(gdd_kueue_cache_key)
GDD_KUEUE_BIN=$GDD_KUEUE_CACHE/bin/kueue
GDD_KUEUE_CONFIG=$GDD_KUEUE_CACHE/config
