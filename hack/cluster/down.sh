#!/usr/bin/env bash
# Stops the local cluster that hack/cluster/up.sh started and removes what it left
# on the host. Idempotent: safe to run when nothing runs or after a crash.
#
# Usage: hack/cluster/down.sh [--state-dir DIR] [--purge] [--quiet] [--check]
#   --state-dir DIR  state directory (env GDD_STATE_DIR, default /tmp/gdd)
#   --purge          also remove the logs (default: keep $GDD_STATE_DIR/logs)
#   --quiet          only print errors
#   --check          fail if any process, network device, iptables rule, mount,
#                    cgroup or file of the cluster is left afterwards
#
# Order, per node: kubelet first (so it restarts nothing), then every k8s.io
# container and task through ctr, containerd, then every process left in the
# node's network namespace or cgroups (shims, containers) and the cgroups; the
# node's namespaces, mounts and network go with its last process. Then the
# control plane, every mount below the state dir, the host bridge and iptables
# rules, CDI specs named /var/run/cdi/${GDD_CDI_PREFIX:-k8s.gpu.dra.dev}* (of
# clusters from before the nodes had namespaces), and the state dir. The binary
# cache is not touched.
set -euo pipefail

GDD_CALLER_DIR=$PWD
cd "$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=hack/cluster/config.sh
source ./config.sh
# shellcheck source=hack/cluster/node.sh
source ./node.sh

purge=false
quiet=false
check=false
while (($#)); do
	case $1 in
	--state-dir)
		gdd_set_state_dir "$2"
		shift
		;;
	--purge) purge=true ;;
	--quiet) quiet=true ;;
	--check) check=true ;;
	-h | --help)
		gdd_usage
		exit 0
		;;
	*) gdd_die "unknown argument $1 (see --help)" ;;
	esac
	shift
done

[[ $(id -u) == 0 ]] || gdd_die "down.sh needs root"
[[ $GDD_STATE_DIR != / && ${#GDD_STATE_DIR} -gt 4 ]] || gdd_die "refusing state dir '$GDD_STATE_DIR'"

say() { $quiet || gdd_log "$@"; }

# stop GRACE-SECONDS PIDS-DIR NAME...: SIGTERM to every named component at once,
# then SIGKILL to those still running after the grace period.
stop() {
	local grace=$1 dir=$2 name pid i
	shift 2
	local -A pids=()
	for name in "$@"; do
		if pid=$(gdd_pid "$name" "$dir"); then
			kill -TERM "$pid" 2>/dev/null || true
			pids[$name]=$pid
		fi
		rm -f "$dir/$name.pid"
	done
	for name in "${!pids[@]}"; do
		pid=${pids[$name]}
		for ((i = 0; i < grace * 10; i++)); do
			[[ -d /proc/$pid ]] || break
			sleep 0.1
		done
		if [[ -d /proc/$pid ]]; then
			say "$name (pid $pid) did not stop after ${grace}s; killing"
			kill -KILL "$pid" 2>/dev/null || true
			while [[ -d /proc/$pid ]]; do sleep 0.1; done
		fi
		say "stopped $name (pid $pid)"
	done
}

# remove_containers SOCKET NODE deletes every task and container in containerd's
# k8s.io namespace (pod containers and sandboxes) while containerd still runs.
remove_containers() {
	local sock=$1 node=$2 id n=0
	ctr_() { "$GDD_BIN/ctr" --address "$sock" --timeout 10s -n k8s.io "$@"; }
	[[ -x $GDD_BIN/ctr ]] || return 0
	for id in $(ctr_ tasks ls -q 2>/dev/null); do
		ctr_ tasks kill --all --signal SIGKILL "$id" >/dev/null 2>&1 || true
	done
	for id in $(ctr_ tasks ls -q 2>/dev/null); do
		ctr_ tasks delete --force "$id" >/dev/null 2>&1 || true
	done
	for id in $(ctr_ containers ls -q 2>/dev/null); do
		ctr_ containers delete "$id" >/dev/null 2>&1 || true
		n=$((n + 1))
	done
	say "node $node: removed $n containers/sandboxes"
}

# mounts_below prints the mount points under the state dir, deepest first.
mounts_below() {
	local mp
	while read -r _ _ _ _ mp _; do
		mp=$(printf '%b' "${mp//\\/\\0}") # mountinfo escapes octal: \040
		[[ $mp == "$GDD_STATE_DIR"/* || $mp == "$GDD_STATE_DIR" ]] && echo "$mp"
	done </proc/self/mountinfo | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-
}

unmount_all() {
	local mp n=0
	for _ in 1 2 3; do
		while IFS= read -r mp; do
			[[ -n $mp ]] || continue
			umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || true
			n=$((n + 1))
		done < <(mounts_below)
		[[ -z $(mounts_below) ]] && break
	done
	((n == 0)) || say "unmounted $n mounts"
	[[ -z $(mounts_below) ]]
}

main() {
	local d
	for d in "$GDD_NODES_DIR"/*/; do
		[[ -d $d ]] && node_remove "$(basename "$d")"
	done
	stop 10 "$GDD_PIDS" kueue vc-scheduler vc-controller-manager vc-webhook-manager kube-scheduler kube-controller-manager kube-apiserver
	stop 10 "$GDD_PIDS" etcd

	unmount_all || gdd_die "mounts left under $GDD_STATE_DIR: $(mounts_below | tr '\n' ' '); not removing it"
	local rule
	while IFS= read -r rule; do
		# shellcheck disable=SC2086
		while iptables -t nat -D $rule 2>/dev/null; do say "removed iptables rule nat $rule"; done
	done < <(gdd_apiserver_dnat_rules)
	if ip link show "$GDD_HOST_BRIDGE" >/dev/null 2>&1; then
		ip link delete "$GDD_HOST_BRIDGE" && say "deleted bridge $GDD_HOST_BRIDGE"
	fi
	if [[ -f $GDD_STATE_DIR/ip_forward.restore ]]; then
		sysctl -qw net.ipv4.ip_forward="$(cat "$GDD_STATE_DIR/ip_forward.restore")" && say "set net.ipv4.ip_forward back to $(sysctl -n net.ipv4.ip_forward)"
		rm -f "$GDD_STATE_DIR/ip_forward.restore"
	fi
	local f
	for f in /var/run/cdi/"$GDD_CDI_PREFIX"*; do
		[[ -e $f ]] || continue
		rm -f -- "$f" && say "removed CDI spec $f"
	done

	if [[ ! -e $GDD_STATE_DIR ]]; then
		:
	elif $purge; then
		rm -rf --one-file-system -- "$GDD_STATE_DIR"
	else
		find "$GDD_STATE_DIR" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf --one-file-system -- {} +
	fi
	if $purge; then
		say "cluster in $GDD_STATE_DIR is down"
	else
		say "cluster in $GDD_STATE_DIR is down; logs kept in $GDD_LOGS"
	fi
	if $check; then
		gdd_check_nothing_left
	fi
}

main
