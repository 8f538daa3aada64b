#!/usr/bin/env bash
# Smoke check of the local cluster: up.sh, a busybox pod from the demo image on the
# bridge CNI network (hostNetwork: false), `kubectl exec ... cat /proc/1/status`,
# the Workload/PodGroup and DRA APIs being served, the API reachable from a pod
# through the "kubernetes" Service IP (in-cluster config); with several nodes, a
# pod on the last node reached from the first one's pod, and the nodes' CDI spec
# dirs apart; then down.sh and nothing of the cluster left on the host.
#
# Usage: hack/cluster/smoke.sh [--keep] [up.sh flags...]
#   --keep  leave the cluster running afterwards (default: down.sh on exit)
# Environment: as for up.sh (GDD_STATE_DIR, ...).
set -euo pipefail

GDD_CALLER_DIR=$PWD
cd "$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=hack/cluster/config.sh
source ./config.sh

keep=false
args=()
for a in "$@"; do
	case $a in
	--keep) keep=true ;;
	-h | --help)
		gdd_usage
		exit 0
		;;
	*) args+=("$a") ;;
	esac
done
# Follow a --state-dir given for up.sh.
for ((i = 0; i < ${#args[@]}; i++)); do
	[[ ${args[i]} == --state-dir ]] && gdd_set_state_dir "${args[i + 1]}"
done
export GDD_STATE_DIR

teardown() {
	local rc=$?
	if ((rc != 0)); then
		gdd_log "smoke check FAILED (exit $rc); component logs in $GDD_LOGS"
		kubectl describe pod smoke 2>/dev/null | tail -n 20 >&2 || true
	fi
	if ! $keep; then
		./down.sh --state-dir "$GDD_STATE_DIR" --check || rc=1
	fi
	exit "$rc"
}
trap teardown EXIT


t0=$(date +%s)
./up.sh "${args[@]}" >/dev/null
t_up=$(($(date +%s) - t0))
# shellcheck disable=SC1091
source "$GDD_STATE_DIR/env"

gdd_log "API check: Workload/PodGroup (scheduling.k8s.io/v1beta1) and DRA (resource.k8s.io/v1)"
# Output is captured first: with pipefail, `cmd | grep -q` fails when grep exits
# early and cmd gets SIGPIPE.
resources=$(kubectl api-resources -o name)
for r in workloads.scheduling.k8s.io podgroups.scheduling.k8s.io resourceclaims.resource.k8s.io \
	resourceslices.resource.k8s.io deviceclasses.resource.k8s.io; do
	grep -qx "$r" <<<"$resources" || gdd_die "API resource $r is not served"
done

t1=$(date +%s)
kubectl apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: smoke
  namespace: default
spec:
  hostNetwork: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: busybox
    image: $GDD_DEMO_IMAGE
    imagePullPolicy: Never
    command: ["sleep", "3600"]
EOF
kubectl wait --for=condition=Ready pod/smoke --timeout=120s
t_pod=$(($(date +%s) - t1))

ip=$(kubectl get pod smoke -o jsonpath='{.status.podIP}')
gdd_log "pod smoke Running with IP $ip (bridge CNI $GDD_CNI_BRIDGE on $(kubectl get pod smoke -o jsonpath='{.spec.nodeName}'))"
[[ -n $ip && $ip != "$(kubectl get pod smoke -o jsonpath='{.status.hostIP}')" ]] ||
	gdd_die "pod has no pod-network IP (got '$ip')"

status=$(kubectl exec smoke -- cat /proc/1/status)
printf '%s\n' "$status" | head -n 8
grep -q $'^Name:\tsleep' <<<"$status" || gdd_die "PID 1 of the pod is not sleep"
if command -v ping >/dev/null; then
	ping -c1 -W2 "$ip" >/dev/null || gdd_die "pod IP $ip is not reachable from the host"
	gdd_log "pod IP $ip reachable from the host"
fi

# In-cluster API access from the pod network: client-go's in-cluster config dials
# the "kubernetes" Service IP, which up.sh routes to the loopback apiserver. The
# static kubectl from the binary cache serves as the client.
kubectl apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: smoke-api
  namespace: default
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: kubectl
    image: $GDD_DEMO_IMAGE
    imagePullPolicy: Never
    command: ["/gdd-bin/kubectl", "get", "--raw", "/version"]
    volumeMounts:
    - {name: bin, mountPath: /gdd-bin, readOnly: true}
  volumes:
  - name: bin
    hostPath: {path: $GDD_BIN, type: Directory}
EOF
kubectl wait --for=jsonpath='{.status.phase}'=Succeeded pod/smoke-api --timeout=60s
version=$(kubectl logs smoke-api)
grep -q "\"gitVersion\": \"$GDD_K8S_VERSION\"" <<<"$version" ||
	gdd_die "in-cluster API check failed: $version"
gdd_log "in-cluster API reachable from the pod network via https://$GDD_SERVICE_IP:443"

# Gang scheduling (GenericWorkload): a PodGroup with minCount 2 keeps its first pod
# Pending until the second one exists, then binds both.
gang_pod() {
	cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
spec:
  schedulingGroup: {podGroupName: smoke-gang}
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: $GDD_DEMO_IMAGE, imagePullPolicy: Never, command: [sleep, "3600"]}
EOF
}
kubectl apply -f - <<EOF
apiVersion: scheduling.k8s.io/v1beta1
kind: PodGroup
metadata:
  name: smoke-gang
  namespace: default
spec:
  schedulingPolicy:
    gang: {minCount: 2}
EOF
gang_pod smoke-gang-1 | kubectl apply -f -
sleep 3
[[ -z $(kubectl get pod smoke-gang-1 -o jsonpath='{.spec.nodeName}') ]] ||
	gdd_die "gang scheduling: smoke-gang-1 was bound before its PodGroup reached minCount"
gang_pod smoke-gang-2 | kubectl apply -f -
kubectl wait --for=condition=Ready pod/smoke-gang-1 pod/smoke-gang-2 --timeout=60s
gdd_log "gang scheduling: PodGroup smoke-gang held its first pod until minCount 2, then bound both"

# Several nodes: pods of two nodes reach each other through the host, and one
# node's CDI spec dir is not another's.
read -r -a nodes <<<"$GDD_NODE_NAMES"
if ((${#nodes[@]} > 1)); then
	first=${nodes[0]} last=${nodes[-1]}
	for n in "$first" "$last"; do
		kubectl apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata: {name: smoke-$n, namespace: default}
spec:
  nodeName: $n
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: $GDD_DEMO_IMAGE, imagePullPolicy: Never, command: [sh, -c, "mkdir -p /w && hostname > /w/index.html && exec httpd -f -p 8080 -h /w"]}
EOF
	done
	kubectl wait --for=condition=Ready "pod/smoke-$first" "pod/smoke-$last" --timeout=60s
	ip=$(kubectl get pod "smoke-$last" -o jsonpath='{.status.podIP}')
	got=$(kubectl exec "smoke-$first" -- sh -c "printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 $ip 8080 | tail -n 1")
	[[ $got == "smoke-$last" ]] || gdd_die "pod on $first could not reach pod $ip on $last (got '$got')"
	gdd_log "pod on $first reached pod $ip on $last"
	./enter.sh "$first" touch /var/run/cdi/smoke-only-on-first.json
	if ./enter.sh "$last" test -e /var/run/cdi/smoke-only-on-first.json || [[ -e /var/run/cdi/smoke-only-on-first.json ]]; then
		gdd_die "a CDI spec written on $first is visible on $last or the host"
	fi
	gdd_log "CDI spec dirs of $first and $last are apart"
fi

gdd_log "smoke check passed: up ${t_up}s, pod Ready ${t_pod}s after apply"
