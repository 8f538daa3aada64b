#!/usr/bin/env bash
# Runs a command (default: a shell) on a node of the local cluster: in the node's
# mount, network, UTS and IPC namespaces, where its kubelet, containerd and pods
# see their files (/var/run/cdi, the kubelet root dir) and network.
#
# Usage: hack/cluster/enter.sh [--state-dir DIR] NODE [CMD [ARG...]]
#   e.g. hack/cluster/enter.sh gpu-node-1 ls /var/run/cdi
set -euo pipefail

GDD_CALLER_DIR=$PWD
cd "$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=hack/cluster/config.sh
source ./config.sh
# shellcheck source=hack/cluster/node.sh
source ./node.sh

case ${1:-} in
-h | --help | "")
	gdd_usage
	exit 0
	;;
--state-dir)
	gdd_set_state_dir "$2"
	shift 2
	;;
esac
node=$1
shift
(($#)) || set -- "${SHELL:-/bin/sh}"
cd "$GDD_CALLER_DIR"
gdd_node_exec "$node" "$@"
