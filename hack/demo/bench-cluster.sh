#!/usr/bin/env bash
# Benchmarks on the local cluster: pod-with-claim start latency (p50/p99 over 50 pods
# on the real node with the real plugin) and scheduler throughput (200 pods with
# claims) against simulated nodes publishing the full device model versus whole GPUs
# only. Brings the cluster up, installs the chart, runs hack/demo/bench, tears down.
# The Go benchmarks that need no cluster (make bench) are hack/bench-go.sh's.
#
# Usage: hack/demo/bench-cluster.sh [bench flags: -latency-pods 50 -throughput-pods 200 -nodes 25]
# The scheduler under churn (issue #14; simulated nodes whose slices follow what is allocated
# on them, pods/s and kube-scheduler CPU per pod, full model ÷ whole GPUs only):
#   hack/demo/bench-cluster.sh -skip-latency -skip-throughput -churn-nodes 100 [-profile /tmp/sched.pprof]
#   (each phase prints kube-scheduler's, kube-apiserver's, etcd's and the bench's own CPU per pod;
#   -apiserver-profile and -bench-profile take those processes' CPU profiles beside -profile's)
# With the patched kube-scheduler of docs/upstream-allocator.md (hack/upstream-allocator/build.sh):
#   GDD_SCHEDULER_BIN_DIR=$(hack/upstream-allocator/build.sh --print-bin-dir) hack/demo/bench-cluster.sh ...
# Environment: KEEP=1 keeps the cluster; GDD_STATE_DIR (/tmp/gdd); GDD_WAIT_FOR_CLUSTER (0);
# GDD_SCHEDULER_BIN_DIR (the directory of the kube-scheduler to run, hack/cluster/up.sh);
# GDD_NODES (1: the benches need one real node; the demo's fleet would only add load).
set -euo pipefail
export GDD_NODES=${GDD_NODES:-1}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=hack/demo/lib.sh
source hack/demo/lib.sh

go build -o bin/bench ./hack/demo/bench
[[ ${KEEP:-} == 1 ]] || trap demo_down EXIT
# shellcheck disable=SC2119 # no extra helm arguments
demo_up
echo "kube-scheduler: $(readlink "/proc/$(cat "$GDD_STATE_DIR/pids/kube-scheduler.pid")/exe")"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, load $(cut -d' ' -f1-3 /proc/loadavg), Kubernetes $(kubectl version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1)"
pid() { cat "$GDD_STATE_DIR/pids/$1.pid"; }
./bin/bench -plugin bin/dra-kubelet-plugin -scheduler-pid "$(pid kube-scheduler)" \
  -control-plane-pids "apiserver=$(pid kube-apiserver),etcd=$(pid etcd)" "$@"
