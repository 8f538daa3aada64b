#!/usr/bin/env bash
# Starts Volcano's scheduler, controller manager and admission webhook manager (its
# Job defaults and validation, which users' Jobs rely on: a task without a name
# or minAvailable) as host processes beside the
# local cluster (hack/cluster/up.sh), the way its control plane runs: the admin
# kubeconfig, loopback health ports, PID files in the cluster's pids/ so that
# hack/cluster/down.sh stops them. The binaries come from ../shared/volcano (or
# GDD_VOLCANO_SRC), checked against its SHA256SUMS and unpacked once into a
# cache directory. Without them it prints why and how to provide them, and
# exits 3, so that callers skip their Volcano parts.
#
# Scheduler config (bin written to <state>/volcano/scheduler.conf): actions
# enqueue, allocate, backfill (Volcano's default); gang; predicates with DRA;
# capacity with DRA (queue quota per DeviceClass, deviceclass/<class>: N);
# network-topology-aware, which places a Job with spec.networkTopology {mode: hard,
# highestTierAllowed: N} as a whole inside one HyperNode of tier N or lower
# (dra-controller keeps a tier-1 HyperNode per NVLink clique; without the plugin
# the allocate action ignores networkTopology). Its HyperNode-level bin packing of
# pods without networkTopology is off, so that other Jobs are placed as before.
#
# Usage: hack/volcano/up.sh [--state-dir DIR] [--print-skip-reason] [--stop]
#   --print-skip-reason  print why Volcano cannot run here (nothing if it can) and exit
#   --stop               stop the processes this script started
set -euo pipefail
# shellcheck source=hack/volcano/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

state=${GDD_STATE_DIR:-/tmp/gdd}
action=up
while (($#)); do
	case $1 in
	--state-dir)
		state=${2:?--state-dir needs a directory}
		shift
		;;
	--print-skip-reason) action=reason ;;
	--stop) action=stop ;;
	-h | --help)
		gdd_usage
		exit 0
		;;
	*) gdd_die "unknown argument $1 (see --help)" ;;
	esac
	shift
done

reason=$(gdd_volcano_missing)
if [[ $action == reason ]]; then
	[[ -z $reason ]] || echo "$reason"
	exit 0
fi
pids=$state/pids
if [[ $action == stop ]]; then
	for b in "${GDD_VOLCANO_BINARIES[@]}"; do
		if pid=$(cat "$pids/$b.pid" 2>/dev/null) && [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == */"$b" ]]; then
			kill -TERM "$pid" && gdd_log "stopped $b (pid $pid)"
		fi
		rm -f "$pids/$b.pid"
	done
	exit 0
fi
if [[ -n $reason ]]; then
	gdd_log "Volcano skipped: $reason"
	exit 3
fi
[[ -f $state/env && -d $pids ]] || gdd_die "no local cluster in $state (start it with hack/cluster/up.sh)"
# KUBECONFIG and the cluster's PATH (kubectl).
# shellcheck disable=SC1091
source "$state/env"

# Unpack once, after checking every file against the build's SHA256SUMS.
cache=$(gdd_volcano_cache)
unpacked=true
for b in "${GDD_VOLCANO_BINARIES[@]}"; do [[ -x $cache/bin/$b ]] || unpacked=false; done
if ! $unpacked || [[ ! -f $cache/.done ]]; then
	mkdir -p "$cache/bin" "$cache/crd"
	for b in "${GDD_VOLCANO_BINARIES[@]}"; do
		(cd "$GDD_VOLCANO_SRC" && grep -E "^[0-9a-f]{64}  $b\.gz$" SHA256SUMS | sha256sum --quiet --strict -c -) ||
			gdd_die "$GDD_VOLCANO_SRC/$b.gz does not match its line in SHA256SUMS"
	done
	for b in "${GDD_VOLCANO_BINARIES[@]}"; do
		gunzip -c "$GDD_VOLCANO_SRC/$b.gz" >"$cache/bin/$b.tmp"
		chmod +x "$cache/bin/$b.tmp" && mv -f "$cache/bin/$b.tmp" "$cache/bin/$b"
	done
	cp "$GDD_VOLCANO_SRC"/crd/*.yaml "$cache/crd/"
	touch "$cache/.done"
	gdd_log "unpacked Volcano ($("$cache/bin/vc-scheduler" --version 2>/dev/null | grep -m1 "^Version:")) into $cache"
fi

# Every CRD: vc-scheduler's cache sync waits for HyperNodes and Numatopologies.
# Server-side: the jobs CRD is too large for client-side apply's annotation.
kubectl apply --server-side --force-conflicts -f "$cache/crd/" >/dev/null
kubectl wait --for=condition=Established --timeout=60s -f "$cache/crd/" >/dev/null

work=$state/volcano
mkdir -p "$work"
cat >"$work/scheduler.conf" <<'CONF'
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
    enablePreemptable: false
  - name: conformance
- plugins:
  - name: overcommit
  - name: drf
    enablePreemptable: false
  - name: predicates
    arguments:
      predicate.DynamicResourceAllocationEnable: true
  - name: capacity
    arguments:
      capacity.DynamicResourceAllocationEnable: true
  - name: nodeorder
  - name: network-topology-aware
    arguments:
      hypernode.binpack.normal-pod.enable: false
CONF

# Volcano's admission webhooks for Jobs, as its chart installs them, but called at
# a loopback URL with a certificate made here (the local cluster has no Service
# proxy); vc-webhook-manager patches the CA into them at start.
hook=$work/webhook
if [[ ! -f $hook/tls.crt ]]; then
	mkdir -p "$hook"
	openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=volcano-admission-ca \
		-keyout "$hook/ca.key" -out "$hook/ca.crt" 2>/dev/null
	openssl req -newkey rsa:2048 -nodes -subj /CN=volcano-admission -keyout "$hook/tls.key" -out "$hook/tls.csr" 2>/dev/null
	printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$hook/ext"
	openssl x509 -req -in "$hook/tls.csr" -CA "$hook/ca.crt" -CAkey "$hook/ca.key" -CAcreateserial -days 3650 \
		-extfile "$hook/ext" -out "$hook/tls.crt" 2>/dev/null
fi
url=https://127.0.0.1:$GDD_VOLCANO_WEBHOOK_PORT
kubectl apply -f - >/dev/null <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: volcano-admission-service-jobs-mutate}
webhooks:
- name: mutatejob.volcano.sh
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  clientConfig: {url: "$url/jobs/mutate"}
  rules: [{apiGroups: [batch.volcano.sh], apiVersions: [v1alpha1], operations: [CREATE], resources: [jobs]}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: volcano-admission-service-jobs-validate}
webhooks:
- name: validatejob.volcano.sh
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  clientConfig: {url: "$url/jobs/validate"}
  rules: [{apiGroups: [batch.volcano.sh], apiVersions: [v1alpha1], operations: [CREATE, UPDATE], resources: [jobs]}]
YAML

start() { # start NAME HEALTHZ ARGS...: run it detached, record its PID
	local name=$1 healthz=$2
	shift 2
	if pid=$(cat "$pids/$name.pid" 2>/dev/null) && [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == */"$name" ]]; then
		gdd_log "$name already runs (pid $pid)"
		return 0
	fi
	setsid "$cache/bin/$name" --kubeconfig="$KUBECONFIG" --scheduler-name=volcano \
		--enable-healthz --healthz-address="$healthz" "$@" </dev/null >"$work/$name.log" 2>&1 &
	echo $! >"$pids/$name.pid"
}
start vc-webhook-manager "$GDD_VOLCANO_WEBHOOK_HEALTHZ" --listen-address=127.0.0.1 --port="$GDD_VOLCANO_WEBHOOK_PORT" \
	--tls-cert-file="$hook/tls.crt" --tls-private-key-file="$hook/tls.key" --ca-cert-file="$hook/ca.crt" \
	--webhook-url="$url" --enabled-admission=/jobs/mutate,/jobs/validate
start vc-scheduler "$GDD_VOLCANO_SCHEDULER_HEALTHZ" --leader-elect=false --scheduler-conf="$work/scheduler.conf" \
	--listen-address="$GDD_VOLCANO_SCHEDULER_METRICS" --cache-dumper=false
start vc-controller-manager "$GDD_VOLCANO_CONTROLLER_HEALTHZ" --leader-elect=false --listen-address="$GDD_VOLCANO_CONTROLLER_METRICS" \
	--controllers=job-controller,pg-controller,queue-controller,gc-controller

# Ready: the scheduler and controller manager healthy, the webhook answering
# over TLS, and the default queue (made by the scheduler) opened by
# the queue controller (closed queues get no jobs).
for _ in $(seq 1 120); do
	if curl -fsS "http://$GDD_VOLCANO_SCHEDULER_HEALTHZ/healthz" >/dev/null 2>&1 &&
		curl -sS --cacert "$hook/ca.crt" -o /dev/null -d '' "$url/jobs/mutate" 2>/dev/null &&
		curl -fsS "http://$GDD_VOLCANO_CONTROLLER_HEALTHZ/healthz" >/dev/null 2>&1 &&
		[[ $(kubectl get queues.scheduling.volcano.sh default -o jsonpath='{.status.state}' 2>/dev/null) == Open ]]; then
		gdd_log "Volcano is up (scheduler name volcano; logs in $work)"
		exit 0
	fi
	for b in "${GDD_VOLCANO_BINARIES[@]}"; do
		[[ -d /proc/$(cat "$pids/$b.pid") ]] || { tail -20 "$work/$b.log" >&2; gdd_die "$b exited (log $work/$b.log)"; }
	done
	sleep 1
done
tail -10 "$work"/*.log >&2
gdd_die "Volcano not ready after 120s (logs in $work)"
