#!/usr/bin/env bash
# make e2e: builds the driver image, brings up the local cluster (GDD_NODES=6: two
# simulated DGX H100 nodes, one L4 node, three GB200 trays; hack/demo/lib.sh), installs the chart, runs test/e2e
# against it and tears the cluster down.
#
# Usage: hack/demo/e2e.sh [go test flags, e.g. -run TestScenarios]
# Environment: KEEP=1 keeps the cluster afterwards; E2E_STRICT=1 fails on known
#   plugin issues too; GDD_STATE_DIR (/tmp/gdd); GDD_WAIT_FOR_CLUSTER (0).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=hack/demo/lib.sh
source hack/demo/lib.sh

on_exit() {
	local rc=$?
	if ((rc != 0)) && [[ -n ${KUBECONFIG:-} ]]; then
		gdd_log "e2e failed; the plugin's last log lines:"
		kubectl -n "$DEMO_NAMESPACE" logs -l app.kubernetes.io/component=kubelet-plugin --tail=40 >&2 || true
	fi
	demo_kueue_build_stop
	if [[ ${KEEP:-} != 1 ]]; then
		demo_down || rc=1 # down.sh --check: the cluster leaves nothing behind
	fi
	exit "$rc"
}
# Compile the tests before the cluster starts, so a build error costs no cluster start.
go test -c -o bin/e2e.test ./test/e2e
go build -o bin/ ./cmd/kubectl-gpu
trap on_exit EXIT
# Kueue for TestKueueTeamQueue: cached, built once, in the background while the
# cluster starts and the other tests run; the test waits for it.
demo_kueue_build_start
# shellcheck disable=SC2119 # no extra helm arguments
DEMO_CRASH_CHECK=1 demo_up
demo_volcano_up
gdd_log "running test/e2e"
# Single-node tests use the first node (the others are cordoned while they run);
# the fleet tests all of them.
E2E=1 E2E_KUBECONFIG=$KUBECONFIG E2E_RELEASE=$DEMO_RELEASE E2E_NAMESPACE=$DEMO_NAMESPACE \
	E2E_NODE=${GDD_NODE_NAMES%% *} E2E_SIMULATE=$DEMO_SIMULATE HELM=$(command -v helm) \
	E2E_KUBECTL_GPU=$PWD/bin/kubectl-gpu E2E_HEALTH_RECOVERY_WINDOW=$DEMO_HEALTH_RECOVERY_WINDOW \
	E2E_KUEUE_DIR=$DEMO_KUEUE_DIR E2E_KUEUE_BUILD_LOG=$DEMO_KUEUE_LOG E2E_STATE_DIR=$GDD_STATE_DIR \
	E2E_VOLCANO=$DEMO_VOLCANO E2E_VOLCANO_SKIP=$DEMO_VOLCANO_SKIP E2E_TRAY_TAINT=$DEMO_TRAY_TAINT \
	./bin/e2e.test -test.v -test.timeout 80m "$@" 2>&1 |
	grep --line-buffered -vE '^=== (RUN|PAUSE|CONT)' || test "${PIPESTATUS[0]}" -eq 0
