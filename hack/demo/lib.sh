# shellcheck shell=bash
# Shared by hack/demo/{demo,e2e,bench-cluster}.sh: bring the local cluster up with the driver
# image, install the chart with simulated GPUs, tear down. Sourced from the repo root.

# shellcheck source=hack/lib/common.sh
source hack/lib/common.sh
gdd_go_env

GDD_STATE_DIR=${GDD_STATE_DIR:-/tmp/gdd}
export GDD_STATE_DIR
# The demo and e2e run on a fleet of GDD_NODES nodes (hack/cluster/node.sh): by
# default two simulated DGX H100 and one L4 node, then three GB200 NVL72 trays, two
# of rack-a and one of rack-b, for the compute domains (DEMO_NODE_MACHINES, NODE=MACHINE
# entries for nodes that do not simulate DEMO_SIMULATE; entries for nodes beyond
# GDD_NODES are ignored). The trays are tainted DEMO_TRAY_TAINT, as a rack's node
# pool usually is, so only the compute-domain parts (which tolerate it) and the
# plugin run there.
GDD_NODES=${GDD_NODES:-6}
export GDD_NODES
DEMO_NODE_MACHINES=${DEMO_NODE_MACHINES:-gpu-node-2=l4x4,gpu-node-3=gb200nvl72@rack-a,gpu-node-4=gb200nvl72@rack-a,gpu-node-5=gb200nvl72@rack-b}
DEMO_TRAY_TAINT=${DEMO_TRAY_TAINT:-demo.gpu.dra.dev/nvl72=true:NoSchedule}
DEMO_RELEASE=${DEMO_RELEASE:-gpu-dra-driver}
DEMO_NAMESPACE=${DEMO_NAMESPACE:-gpu-dra-driver}
DEMO_SIMULATE=${DEMO_SIMULATE:-dgxh100}
DEMO_CHART=deployments/helm/gpu-dra-driver
# The plugin's --health-recovery-window in the demo and e2e: short, so the health part
# sees a tainted GPU come back within a minute; long enough to look at the pod status and a refused claim first (the plugin's default is 10m).
DEMO_HEALTH_RECOVERY_WINDOW=${DEMO_HEALTH_RECOVERY_WINDOW:-30s}
# The plugin's --stale-claim-grace-period: short, so e2e TestStaleClaimsReleased sees a
# claim the kubelet forgot released within a minute (the plugin's default is 5m).
DEMO_STALE_CLAIM_GRACE_PERIOD=${DEMO_STALE_CLAIM_GRACE_PERIOD:-30s}
# Seconds to wait for a cluster that someone else runs on this machine to go away
# (only one can run); 0 fails at once.
GDD_WAIT_FOR_CLUSTER=${GDD_WAIT_FOR_CLUSTER:-0}

# demo_cluster_pids prints the PIDs of cluster processes running on this machine.
demo_cluster_pids() {
	pgrep -x kube-apiserver
	pgrep -x etcd
	pgrep -x kubelet
}

# demo_wait_no_cluster waits until no cluster runs on this machine. The scripts of
# hack/demo also take a lock for their whole run ($GDD_STATE_DIR.lock), so two of
# them never start a cluster at the same time; other users of hack/cluster are seen
# by their processes.
demo_wait_no_cluster() {
	local waited=0
	exec {DEMO_LOCK_FD}>"${GDD_STATE_DIR%/}.lock"
	if ! flock -n "$DEMO_LOCK_FD"; then
		gdd_log "another hack/demo script runs; waiting up to ${GDD_WAIT_FOR_CLUSTER}s for it"
		flock -w "$GDD_WAIT_FOR_CLUSTER" "$DEMO_LOCK_FD" ||
			gdd_die "another hack/demo script still runs after ${GDD_WAIT_FOR_CLUSTER}s (lock ${GDD_STATE_DIR%/}.lock)"
	fi
	while [[ -n $(demo_cluster_pids) ]]; do
		if ((waited >= GDD_WAIT_FOR_CLUSTER)); then
			gdd_die "a Kubernetes cluster already runs on this machine (pids $(demo_cluster_pids | tr '\n' ' ')); stop it with hack/cluster/down.sh if it is yours, or set GDD_WAIT_FOR_CLUSTER=<seconds> to wait for it"
		fi
		((waited == 0)) && gdd_log "another cluster runs on this machine; waiting up to ${GDD_WAIT_FOR_CLUSTER}s for it to stop"
		sleep 10
		waited=$((waited + 10))
	done
}

# demo_up builds the driver image, starts the cluster with it and installs the chart.
# Extra arguments go to helm.
demo_up() {
	local image log
	gdd_log "building the driver image"
	image=$(hack/demo/image.sh)
	demo_wait_no_cluster
	if [[ ${DEMO_CRASH_CHECK:-} == 1 ]]; then
		gdd_log "checking that down.sh cleans up after a crash of up.sh (hack/cluster/crash-check.sh)"
		hack/cluster/crash-check.sh --state-dir "$GDD_STATE_DIR" {DEMO_LOCK_FD}>&-
	fi
	gdd_log "starting the local cluster (state dir $GDD_STATE_DIR)"
	log=$(mktemp)
	# The cluster's processes must not hold this script's lock.
	if ! hack/cluster/up.sh --state-dir "$GDD_STATE_DIR" --nodes "$GDD_NODES" --image "$PWD/$image" {DEMO_LOCK_FD}>&- 2> >(tee "$log" >&2) >/dev/null; then
		sleep 0.2 # let tee finish
		# up.sh refuses before starting anything when someone else's cluster came up
		# in the meantime: that one must not be torn down.
		if ! grep -qE 'a cluster is running in|is in use by another process' "$log"; then
			DEMO_STARTED_CLUSTER=1
		fi
		rm -f "$log"
		gdd_die "hack/cluster/up.sh failed"
	fi
	rm -f "$log"
	DEMO_STARTED_CLUSTER=1
	# shellcheck disable=SC1091
	source "$GDD_STATE_DIR/env"
	demo_taint_trays
	demo_install "$@"
}

# demo_taint_trays taints the nodes DEMO_NODE_MACHINES makes GB200 trays with
# DEMO_TRAY_TAINT.
demo_taint_trays() {
	local entry node
	for entry in ${DEMO_NODE_MACHINES//,/ }; do
		node=${entry%%=*}
		[[ ${entry#*=} == gb200* && " ${GDD_NODE_NAMES:-} " == *" $node "* ]] || continue
		kubectl taint node "$node" "$DEMO_TRAY_TAINT" --overwrite >/dev/null
	done
}

# demo_tray_toleration_args prints the helm arguments that let the plugin run on
# the tainted trays.
demo_tray_toleration_args() {
	local key=${DEMO_TRAY_TAINT%%=*} effect=${DEMO_TRAY_TAINT##*:}
	printf '%s\n' --set "kubeletPlugin.tolerations[0].key=$key" \
		--set "kubeletPlugin.tolerations[0].operator=Exists" \
		--set "kubeletPlugin.tolerations[0].effect=$effect"
}

# demo_node_machine_args prints the helm arguments that give nodes of
# DEMO_NODE_MACHINES their own simulated machine.
# demo_volcano_up starts Volcano beside the cluster (hack/volcano/up.sh) and
# sets DEMO_VOLCANO=1, or, where ../shared/volcano is absent, DEMO_VOLCANO_SKIP
# to the reason, so that the Volcano parts say why they were skipped.
# shellcheck disable=SC2034 # for the scripts that source this
demo_volcano_up() {
	DEMO_VOLCANO=0
	DEMO_VOLCANO_SKIP=$(hack/volcano/up.sh --print-skip-reason)
	if [[ -n $DEMO_VOLCANO_SKIP ]]; then
		gdd_log "Volcano parts skipped: $DEMO_VOLCANO_SKIP"
		return 0
	fi
	hack/volcano/up.sh --state-dir "$GDD_STATE_DIR" {DEMO_LOCK_FD}>&-
	DEMO_VOLCANO=1
}

demo_node_machine_args() {
	local entry node
	for entry in ${DEMO_NODE_MACHINES//,/ }; do
		node=${entry%%=*}
		[[ " ${GDD_NODE_NAMES:-} " == *" $node "* ]] || continue
		printf '%s\n' --set "simulateNodeMachines.$node=${entry#*=}"
	done
}

# demo_install installs (or upgrades) the chart with simulated GPUs and waits for the
# plugin on every node to publish its slices.
demo_install() {
	local machines
	mapfile -t machines < <(demo_node_machine_args; demo_tray_toleration_args)
	gdd_log "helm install $DEMO_RELEASE (simulate=$DEMO_SIMULATE ${machines[*]}, kubeletDir=$GDD_STATE_DIR/node/kubelet, health recovery window $DEMO_HEALTH_RECOVERY_WINDOW)"
	helm upgrade --install "$DEMO_RELEASE" "$DEMO_CHART" -n "$DEMO_NAMESPACE" --create-namespace \
		--set simulate="$DEMO_SIMULATE" "${machines[@]}" --set kubeletDir="$GDD_STATE_DIR/node/kubelet" \
		--set kubeletPlugin.health.recoveryWindow="$DEMO_HEALTH_RECOVERY_WINDOW" \
		--set kubeletPlugin.staleClaimGracePeriod="$DEMO_STALE_CLAIM_GRACE_PERIOD" \
		--wait --timeout 3m "$@" >/dev/null
	local _ want=${GDD_NODES:-1} got
	for _ in $(seq 1 120); do
		got=$(kubectl get resourceslices --field-selector spec.driver=gpu.dra.dev -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' 2>/dev/null | sort -u | grep -c . || true)
		if ((got >= want)); then
			gdd_log "driver running on $got node(s): $(kubectl get resourceslices --field-selector spec.driver=gpu.dra.dev --no-headers | wc -l) ResourceSlices published"
			return 0
		fi
		sleep 1
	done
	kubectl -n "$DEMO_NAMESPACE" logs -l app.kubernetes.io/component=kubelet-plugin --tail=30 >&2 || true
	gdd_die "the kubelet plugins published ResourceSlices on $got of $want nodes"
}

# demo_down stops the cluster, but only one that demo_up started: a script that failed
# or was interrupted while waiting for someone else's cluster leaves that one alone.
demo_down() {
	if [[ ${DEMO_STARTED_CLUSTER:-} != 1 ]]; then
		gdd_log "not stopping the local cluster: this script did not start it"
		return 0
	fi
	gdd_log "stopping the local cluster"
	hack/cluster/down.sh --state-dir "$GDD_STATE_DIR" --quiet --check || {
		gdd_log "down.sh failed or left something behind; run hack/cluster/down.sh"
		return 1
	}
}

# demo_kueue_build_start builds Kueue (hack/kueue/build.sh, cached) in the
# background, behind the cluster and the parts that need no Kueue; the Kueue parts
# wait for it (internal/kueue WaitBuilt). Sets DEMO_KUEUE_DIR and DEMO_KUEUE_LOG;
# demo_kueue_build_stop ends a build still running when the script exits early.
# shellcheck disable=SC2034 # DEMO_KUEUE_DIR is for the scripts that source this
demo_kueue_build_start() {
	DEMO_KUEUE_DIR=$(hack/kueue/build.sh --print-dir)
	DEMO_KUEUE_LOG=$PWD/bin/kueue-build.log
	mkdir -p bin
	setsid hack/kueue/build.sh >"$DEMO_KUEUE_LOG" 2>&1 </dev/null &
	DEMO_KUEUE_PID=$!
	gdd_log "building Kueue in the background (log $DEMO_KUEUE_LOG)"
}

demo_kueue_build_stop() {
	if [[ -n ${DEMO_KUEUE_PID:-} ]]; then
		kill -- -"$DEMO_KUEUE_PID" 2>/dev/null || true
	fi
}
