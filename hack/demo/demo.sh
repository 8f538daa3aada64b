#!/usr/bin/env bash
# make demo: builds the driver image (cached Go builds), brings up the local cluster
# (hack/cluster, built once), installs the Helm chart with simulated DGX H100 GPUs,
# runs the demo (./demo: dra-controller admission and node labels, device health with a
# simulated XID, every scenario of demo/specs, kubectl gpu, a team's batch queue with
# Kueue built by hack/kueue/build.sh) and tears the cluster down.
#
# Usage: hack/demo/demo.sh [demo flags, e.g. -run controller,health,03,04]
# Environment: KEEP=1 keeps the cluster and the last scenario running (then:
#   source /tmp/gdd/env; kubectl get pods -A; hack/cluster/down.sh),
#   DEMO_SIMULATE (dgxh100), DEMO_HEALTH_RECOVERY_WINDOW (30s), GDD_STATE_DIR (/tmp/gdd), GDD_WAIT_FOR_CLUSTER (0).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=hack/demo/lib.sh
source hack/demo/lib.sh

args=("$@")
if [[ ${KEEP:-} == 1 ]]; then
	args=(-keep-last "${args[@]}")
	trap demo_kueue_build_stop EXIT
else
	trap 'demo_kueue_build_stop; demo_down' EXIT
fi
# Compile before the cluster starts, so a build error costs no cluster start.
go build -o bin/demo ./demo
go build -o bin/ ./cmd/kubectl-gpu
demo_up --set logVerbosity=2
# Volcano for the volcano part (from ../shared/volcano; skipped, saying why, without it).
demo_volcano_up
volcano=(-volcano)
[[ -z $DEMO_VOLCANO_SKIP ]] || volcano=(-volcano-skip "$DEMO_VOLCANO_SKIP")
# Kueue for the kueue part, the last one: cached, built once, in the background
# while the other parts run; the kueue part waits for it.
demo_kueue_build_start
rc=0
./bin/demo -kueue-dir "$DEMO_KUEUE_DIR" -kueue-build-log "$DEMO_KUEUE_LOG" -state-dir "$GDD_STATE_DIR" "${volcano[@]}" "${args[@]}" || rc=$?
if [[ ${KEEP:-} == 1 ]]; then
	gdd_log "KEEP=1: the cluster keeps running. source $GDD_STATE_DIR/env; kubectl get pods -A; hack/cluster/down.sh"
fi
exit "$rc"
