# shellcheck shell=bash
# Where hack/volcano finds Volcano's binaries (../shared/volcano beside the
# repository, or GDD_VOLCANO_SRC) and where it unpacks them (a cache directory
# keyed by the SHA256SUMS of the build, so a new build gets a new directory).
# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

GDD_VOLCANO_SRC=${GDD_VOLCANO_SRC:-$(cd "$GDD_REPO_ROOT/.." && pwd)/shared/volcano}
GDD_VOLCANO_CACHE_ROOT=${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver}
# The binaries hack/volcano runs, each the name of its PID file too.
GDD_VOLCANO_BINARIES=(vc-scheduler vc-controller-manager vc-webhook-manager)
# Loopback ports of the scheduler's and controller manager's health and metrics
# servers (their defaults, :11251 and :8080, are all interfaces and collide).
GDD_VOLCANO_SCHEDULER_HEALTHZ=${GDD_VOLCANO_SCHEDULER_HEALTHZ:-127.0.0.1:11261}
GDD_VOLCANO_SCHEDULER_METRICS=${GDD_VOLCANO_SCHEDULER_METRICS:-127.0.0.1:18081}
GDD_VOLCANO_CONTROLLER_HEALTHZ=${GDD_VOLCANO_CONTROLLER_HEALTHZ:-127.0.0.1:11262}
GDD_VOLCANO_CONTROLLER_METRICS=${GDD_VOLCANO_CONTROLLER_METRICS:-127.0.0.1:18082}
GDD_VOLCANO_WEBHOOK_HEALTHZ=${GDD_VOLCANO_WEBHOOK_HEALTHZ:-127.0.0.1:11263}
GDD_VOLCANO_WEBHOOK_PORT=${GDD_VOLCANO_WEBHOOK_PORT:-18443}

# gdd_volcano_missing prints why Volcano cannot run here (and how to provide it),
# or nothing when ../shared/volcano has what hack/volcano needs.
gdd_volcano_missing() {
	local f
	for f in SHA256SUMS "${GDD_VOLCANO_BINARIES[@]/%/.gz}"; do
		if [[ ! -f $GDD_VOLCANO_SRC/$f ]]; then
			echo "no Volcano build at $GDD_VOLCANO_SRC ($f missing): Volcano's Go module is not served by the module proxy here; put vc-scheduler.gz, vc-controller-manager.gz, vc-webhook-manager.gz, crd/*.yaml and SHA256SUMS of one build there (see docs/volcano.md) or point GDD_VOLCANO_SRC at them"
			return 0
		fi
	done
	if ! compgen -G "$GDD_VOLCANO_SRC/crd/*.yaml" >/dev/null; then
		echo "no Volcano CRDs under $GDD_VOLCANO_SRC/crd (see docs/volcano.md)"
	fi
}

# gdd_volcano_cache prints the cache directory of the build at GDD_VOLCANO_SRC.
gdd_volcano_cache() {
	echo "$GDD_VOLCANO_CACHE_ROOT/volcano-$(sha256sum <"$GDD_VOLCANO_SRC/SHA256SUMS" | cut -c1-12)"
}
