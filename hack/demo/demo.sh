#!/usr/bin/env bash
# make demo: builds the driver image (cached Go builds), brings up the local cluster
# (hack/cluster, built once), installs the Helm chart with simulated DGX H100 GPUs,
# runs every scenario of demo/specs with `go run ./demo` and tears the cluster down.
#
# Usage: hack/demo/demo.sh [demo flags, e.g. -run 03,04]
# Environment: KEEP=1 keeps the cluster and the last scenario running (then:
#   source /tmp/gdd/env; kubectl get pods -A; hack/cluster/down.sh),
#   DEMO_SIMULATE (dgxh100), GDD_STATE_DIR (/tmp/gdd), GDD_WAIT_FOR_CLUSTER (0).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=hack/demo/lib.sh
source hack/demo/lib.sh
export CGO_ENABLED=1 CGO_CFLAGS=${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}

args=("$@")
if [[ ${KEEP:-} == 1 ]]; then
	args=(-keep-last "${args[@]}")
else
	trap demo_down EXIT
fi
# Compile before the cluster starts, so a build error costs no cluster start.
go build -o bin/demo ./demo
demo_up --set logVerbosity=2
rc=0
./bin/demo "${args[@]}" || rc=$?
if [[ ${KEEP:-} == 1 ]]; then
	demo_log "KEEP=1: the cluster keeps running. source $GDD_STATE_DIR/env; kubectl get pods -A; hack/cluster/down.sh"
fi
exit "$rc"
