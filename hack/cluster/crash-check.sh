#!/usr/bin/env bash
# Checks that down.sh cleans up after a crash of up.sh: starts up.sh with two
# nodes, SIGKILLs it (and nothing else) once the first node's kubelet runs,
# while the second node is being made, then runs down.sh and fails if any
# process, network device, iptables rule, mount, cgroup or file of the cluster
# is left. make e2e runs it before its cluster starts (about 30 s).
#
# Usage: hack/cluster/crash-check.sh [--state-dir DIR]
set -euo pipefail

GDD_CALLER_DIR=$PWD
cd "$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=hack/cluster/config.sh
source ./config.sh

case ${1:-} in
-h | --help)
	gdd_usage
	exit 0
	;;
--state-dir) gdd_set_state_dir "$2" ;;
esac
export GDD_STATE_DIR

# The baseline is the machine without any cluster of ours: an earlier run that
# was killed (not shut down) may have left forwarding on and a note of the value
# before it, which up.sh's clean-up restores. Clean up first, then read it.
for c in "${GDD_COMPONENTS[@]}"; do
	! gdd_pid "$c" >/dev/null || gdd_die "a cluster is running in $GDD_STATE_DIR ($c); stop it with hack/cluster/down.sh first"
done
if [[ -n $(find "$GDD_STATE_DIR" -mindepth 1 -maxdepth 1 ! -name logs 2>/dev/null) ]]; then
	gdd_log "cleaning up after an earlier run in $GDD_STATE_DIR before the check"
	./down.sh --state-dir "$GDD_STATE_DIR" --quiet
fi
forward=$(sysctl -n net.ipv4.ip_forward) # up.sh may turn it on; down.sh must restore it
./up.sh --no-build --nodes 2 >/dev/null 2>&1 &
up=$!
first=$GDD_NODES_DIR/$(gdd_node_name 0)/pids/kubelet.pid
for _ in $(seq 1 600); do
	[[ -s $first ]] && break
	kill -0 "$up" 2>/dev/null || gdd_die "up.sh ended before its first node's kubelet started (logs in $GDD_LOGS)"
	sleep 0.1
done
[[ -s $first ]] || gdd_die "up.sh did not start a kubelet within 60 s"
kill -KILL "$up"
wait "$up" 2>/dev/null || true
gdd_log "killed up.sh (pid $up) after $(gdd_node_name 0)'s kubelet started"
./down.sh --state-dir "$GDD_STATE_DIR" --quiet --check
[[ $(sysctl -n net.ipv4.ip_forward) == "$forward" ]] ||
	gdd_die "down.sh left net.ipv4.ip_forward at $(sysctl -n net.ipv4.ip_forward); it was $forward before up.sh"
