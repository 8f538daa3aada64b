# shellcheck shell=bash
# One node of the local cluster: its namespaces, network, containerd and kubelet.
# Sourced by up.sh and down.sh after config.sh.
#
# A node is a process that holds new mount, network, UTS and IPC namespaces
# (unshare ... sleep infinity; its PID in $GDD_NODES_DIR/<name>/pids/ns.pid).
# containerd and the kubelet are started in them with nsenter, so every pod and
# every hostPath of the node resolves in the node's own mount namespace:
#   $GDD_NODE_LOCAL           bind of $GDD_NODES_DIR/<name> (kubelet root, containerd, CNI)
#   $GDD_NODES_DIR            an empty tmpfs: no node sees another's files
#   /var/run/cdi, /etc/cdi    binds of <node>/cdi and <node>/etc-cdi (CDI specs)
#   /run/containerd           bind of <node>/run-containerd (shim sockets)
#   /var/log/containers       bind of <node>/log-containers (the kubelet's symlinks)
#   /var/lib/kubelet          bind of <node>/kubelet, the kubelet's --root-dir: what the
#                             kubelet keeps there whatever its root dir (device-plugins/)
# Its network namespace has eth0 at $(gdd_node_ip i) on the host bridge, its pods
# on its own CNI bridge in $(gdd_pod_cidr i), routed through the host, and a DNAT of
# the "kubernetes" Service IP to the API server. Its pods run in the cgroup
# /gdd-<name> of every hierarchy (the kubelet's cgroupRoot), so that no kubelet
# takes another's pods for orphans. Nothing of a node outlives its processes
# except files in its directory and its cgroups, which down.sh removes.

# gdd_node_pids NAME: the node's PID directory (host view).
gdd_node_pids() { echo "$GDD_NODES_DIR/$1/pids"; }

# gdd_node_ns_pid NAME prints the PID holding the node's namespaces.
gdd_node_ns_pid() {
	local pid
	pid=$(cat "$(gdd_node_pids "$1")/ns.pid" 2>/dev/null) || return 1
	[[ $pid =~ ^[0-9]+$ && $(readlink "/proc/$pid/ns/net" 2>/dev/null) == "$(cat "$GDD_NODES_DIR/$1/netns.id" 2>/dev/null)" ]] || return 1
	echo "$pid"
}

# gdd_node_exec NAME CMD...: runs CMD in the node's namespaces.
gdd_node_exec() {
	local pid
	pid=$(gdd_node_ns_pid "$1") || gdd_die "node $1 is not running"
	shift
	nsenter -t "$pid" -m -n -u -i -- "$@"
}

# gdd_cgroup_dirs NAME prints the node's cgroup directory in every cgroup v1
# hierarchy mounted below /sys/fs/cgroup, v2 "unified" too (the kubelet's cgroupRoot /gdd-NAME).
gdd_cgroup_dirs() {
	local h
	for h in /sys/fs/cgroup/*; do
		[[ -d $h && ! -L $h ]] || continue
		echo "$h/gdd-$1"
	done
}

# node_ns_create I: the namespaces, directories, mounts and network of node I.
node_ns_create() {
	local i=$1 name dir pid hv cdi
	name=$(gdd_node_name "$i")
	dir=$(gdd_node_dir "$name")
	mkdir -p "$dir"/{pids,kubelet,containerd,cni/net.d,cni/ipam,cdi,etc-cdi,run-containerd,log-containers,pod-logs} \
		"$GDD_NODE_LOCAL" /var/run/cdi /etc/cdi /run/containerd /var/log/containers /var/lib/kubelet
	setsid unshare --mount --net --uts --ipc --propagation private sleep infinity </dev/null >/dev/null 2>&1 &
	pid=$!
	echo "$pid" >"$dir/pids/ns.pid"
	# unshare has made the namespaces once its PID runs sleep.
	while [[ $(readlink "/proc/$pid/exe" 2>/dev/null) != */sleep ]]; do
		[[ -d /proc/$pid ]] || gdd_die "unshare for node $name failed"
		sleep 0.05
	done
	readlink "/proc/$pid/ns/net" >"$dir/netns.id"
	cdi=$(realpath -m /var/run/cdi)
	# The kubelet allows Bidirectional mount propagation only below a shared mount
	# (the plugin mounts the MPS daemons' tmpfs through its data dir).
	nsenter -t "$pid" -m -u -- sh -ec "
		hostname '$name'
		mount --bind '$dir' '$GDD_NODE_LOCAL'
		mount --make-rshared '$GDD_NODE_LOCAL'
		mount -t tmpfs -o size=64k,mode=0755 gdd-nodes '$GDD_NODES_DIR'
		mount --bind '$GDD_NODE_LOCAL/cdi' '$cdi'
		mount --bind '$GDD_NODE_LOCAL/etc-cdi' /etc/cdi
		mount --bind '$GDD_NODE_LOCAL/run-containerd' /run/containerd
		mount --bind '$GDD_NODE_LOCAL/log-containers' /var/log/containers
		mount --bind '$GDD_NODE_LOCAL/kubelet' /var/lib/kubelet"

	hv=gddv$i
	ip link add "$hv" type veth peer name eth0 netns "$pid"
	ip link set "$hv" master "$GDD_HOST_BRIDGE" up
	local c="-m comment --comment gdd-apiserver"
	nsenter -t "$pid" -n -- sh -ec "
		ip link set lo up
		ip addr add $(gdd_node_ip "$i")/24 dev eth0
		ip link set eth0 up
		ip route add default via $GDD_HOST_IP
		sysctl -qw net.ipv4.ip_forward=1
		iptables -t nat -A OUTPUT -d $GDD_SERVICE_IP/32 -p tcp --dport 443 $c -j DNAT --to-destination $GDD_HOST_IP:$GDD_APISERVER_PORT
		iptables -t nat -A PREROUTING -d $GDD_SERVICE_IP/32 -p tcp --dport 443 $c -j DNAT --to-destination $GDD_HOST_IP:$GDD_APISERVER_PORT"
	ip route replace "$(gdd_pod_cidr "$i")" via "$(gdd_node_ip "$i")"

	local cg
	for cg in $(gdd_cgroup_dirs "$name"); do
		mkdir -p "$cg"
		if [[ -f $cg/cpuset.cpus ]]; then
			cat "$(dirname "$cg")/cpuset.cpus" >"$cg/cpuset.cpus"
			cat "$(dirname "$cg")/cpuset.mems" >"$cg/cpuset.mems"
		fi
	done
	gdd_log "node $name: namespaces of pid $pid, IP $(gdd_node_ip "$i"), pods $(gdd_pod_cidr "$i")"
}

# node_start NAME COMPONENT CMD...: starts CMD in the node's namespaces, detached,
# logging to logs/NAME/COMPONENT.log, its PID in the node's PID directory.
node_start() {
	local name=$1 comp=$2 pid
	shift 2
	pid=$(gdd_node_ns_pid "$name") || gdd_die "node $name has no namespaces"
	mkdir -p "$GDD_LOGS/$name"
	setsid nsenter -t "$pid" -m -n -u -i -- "$@" >"$GDD_LOGS/$name/$comp.log" 2>&1 </dev/null &
	echo $! >"$(gdd_node_pids "$name")/$comp.pid"
}

# node_containerd I: containerd of node I, with its CNI config and the images
# (up.sh's snapshotter and extra_images).
# shellcheck disable=SC2154
node_containerd() {
	local i=$1 name dir img
	name=$(gdd_node_name "$i")
	dir=$(gdd_node_dir "$name")
	containerd_config >"$dir/containerd/config.toml"
	# ipMasq off: pods reach each other and the host, not the outside, and no
	# iptables rules are left behind when pods are removed without a CNI DEL.
	cat >"$dir/cni/net.d/10-gdd-bridge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "gdd-bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$GDD_CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$GDD_CNI_IPAM_DIR",
        "ranges": [[{"subnet": "$(gdd_pod_cidr "$i")"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
	# containerd finds containerd-shim-runc-v2 on PATH and runc in /usr/sbin.
	node_start "$name" containerd env PATH="$GDD_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
		"$GDD_BIN/containerd" --config "$GDD_CTRD_DIR/config.toml"
	local sock t0
	sock=$(gdd_host_path "$name" "$GDD_CTRD_SOCK")
	t0=$(date +%s)
	until "$GDD_BIN/ctr" --address "$sock" version >/dev/null 2>&1; do
		gdd_pid containerd "$(gdd_node_pids "$name")" >/dev/null ||
			{ tail -n 20 "$GDD_LOGS/$name/containerd.log" >&2; gdd_die "containerd of $name exited"; }
		(($(date +%s) - t0 < GDD_TIMEOUT)) || gdd_die "containerd of $name not serving after ${GDD_TIMEOUT}s"
		sleep 0.2
	done
	for img in "$GDD_IMAGES/pause.tar" "$GDD_IMAGES/demo.tar" "${extra_images[@]}"; do
		"$GDD_BIN/ctr" --address "$sock" -n k8s.io images import --snapshotter "$snapshotter" "$img" \
			>>"$GDD_LOGS/$name/images.log" 2>&1 || gdd_die "import $img on $name failed; see $GDD_LOGS/$name/images.log"
	done
	gdd_log "node $name: containerd serving, images imported"
}

# containerd_config prints a node's containerd config (node-local paths).
containerd_config() {
	cat <<EOF
version = 3
root = "$GDD_CTRD_DIR/root"
state = "$GDD_CTRD_DIR/state"
# NRI would listen on the host-global /var/run/nri/nri.sock.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "$GDD_CTRD_SOCK"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "$snapshotter"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$GDD_PAUSE_IMAGE"

[plugins.'io.containerd.cri.v1.runtime']
  # No CAP_SYS_RESOURCE here: without this every sandbox fails in runc with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  # Keep network namespace mounts under the state dir instead of /var/run/netns.
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      Root = "$GDD_RUNC_ROOT"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$GDD_CNI_CONF_DIR"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
EOF
}

# node_kubelet I: the kubelet of node I.
node_kubelet() {
	local i=$1 name dir
	name=$(gdd_node_name "$i")
	dir=$(gdd_node_dir "$name")
	cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$GDD_CTRD_SOCK
# The host is cgroup v1 (hybrid); no systemd. Each node's pods in their own tree.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /gdd-$name
failSwapOn: false
# Images are imported by hand and cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $GDD_PKI/ca.crt
authorization:
  mode: Webhook
clusterDomain: cluster.local
healthzBindAddress: 127.0.0.1
podLogsDir: $GDD_NODE_LOCAL/pod-logs
volumePluginDir: $GDD_KUBELET_DIR/volume-plugins
serializeImagePulls: false
kubeAPIQPS: 100
kubeAPIBurst: 200
featureGates:
$(feature_gates_yaml)
EOF
	node_start "$name" kubelet "$GDD_BIN/kubelet" --config="$GDD_NODE_LOCAL/kubelet.yaml" \
		--kubeconfig="$GDD_KUBECONFIG/kubelet-$name.kubeconfig" \
		--root-dir="$GDD_KUBELET_DIR" --cert-dir="$GDD_KUBELET_DIR/pki" \
		--hostname-override="$name" --node-ip="$(gdd_node_ip "$i")" --v="$GDD_VERBOSITY"
	gdd_log "node $name: started kubelet (log $GDD_LOGS/$name/kubelet.log)"
}

# node_processes NAME prints the PIDs of every process of the node: those in its
# network namespace (kubelet, containerd, shims, hostNetwork pods) and
# those in its cgroups (every pod container).
node_processes() {
	local name=$1 dir netns p cg
	dir=$(gdd_node_dir "$name")
	netns=$(cat "$dir/netns.id" 2>/dev/null || true)
	{
		if [[ -n $netns ]]; then
			for p in /proc/[0-9]*; do
				if [[ $(readlink "$p/ns/net" 2>/dev/null) == "$netns" ]]; then
					echo "${p#/proc/}"
				fi
			done
		fi
		for cg in $(gdd_cgroup_dirs "$name"); do
			if [[ -d $cg ]]; then
				find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null || true
			fi
		done
	} | sort -un
}

# node_remove NAME: stops every process of the node (kubelet first, then its
# containers through containerd, then the rest) and removes its cgroups. Its
# namespaces, mounts, veth pair and pod route go with its last process.
node_remove() {
	local name=$1 pids sock i
	pids=$(gdd_node_pids "$name")
	stop 15 "$pids" kubelet
	sock=$(gdd_host_path "$name" "$GDD_CTRD_SOCK")
	if gdd_pid containerd "$pids" >/dev/null && [[ -S $sock ]]; then
		remove_containers "$sock" "$name"
	fi
	stop 10 "$pids" containerd
	for i in 1 2 3 4 5 6 7 8 9 10; do
		local left
		left=$(node_processes "$name")
		[[ -n $left ]] || break
		# shellcheck disable=SC2086 # one PID per word
		kill -KILL $left 2>/dev/null || true
		sleep 0.3
	done
	[[ -z $(node_processes "$name") ]] || say "node $name: processes left: $(node_processes "$name" | tr '\n' ' ')"
	local cg
	for cg in $(gdd_cgroup_dirs "$name"); do
		if [[ -d $cg ]]; then
			find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
		fi
	done
	# The holder itself, also when up.sh died before it recorded the
	# namespace id by which node_processes finds it.
	local holder
	holder=$(cat "$pids/ns.pid" 2>/dev/null || true)
	if [[ $holder =~ ^[0-9]+$ && $(readlink "/proc/$holder/exe" 2>/dev/null) == */sleep ]]; then
		kill -KILL "$holder" 2>/dev/null || true
	fi
	rm -f "$pids/ns.pid"
	say "node $name: stopped"
}

# gdd_check_nothing_left fails, naming them, if processes, network devices,
# iptables rules, mounts or cgroups of a cluster in the state dir are left on
# the host (after down.sh).
gdd_check_nothing_left() {
	local left=() p
	for p in kubelet containerd etcd kube-apiserver; do
		pgrep -x "$p" >/dev/null && left+=("$p processes")
	done
	# A node's namespace holder: sleep in a network namespace not the host's.
	local host pid
	host=$(readlink /proc/self/ns/net)
	for pid in $(pgrep -x sleep || true); do
		if [[ $(readlink "/proc/$pid/ns/net" 2>/dev/null) != "$host" && $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) == "sleep infinity " ]]; then
			left+=("namespace holder $pid")
		fi
	done
	ip link show "$GDD_HOST_BRIDGE" >/dev/null 2>&1 && left+=("bridge $GDD_HOST_BRIDGE")
	[[ -n $(ip -o link show | grep -E ' gddv[0-9]+@' || true) ]] && left+=("veth devices")
	iptables-save -t nat | grep -q "gdd-apiserver:$GDD_STATE_DIR" && left+=("iptables rules")
	grep -q " $GDD_STATE_DIR" /proc/self/mountinfo && left+=("mounts below $GDD_STATE_DIR")
	compgen -G '/sys/fs/cgroup/*/gdd-*' >/dev/null && left+=("cgroups $(echo /sys/fs/cgroup/*/gdd-*)")
	[[ -n $(find "$GDD_STATE_DIR" -mindepth 1 -maxdepth 1 ! -name logs 2>/dev/null) ]] && left+=("files in $GDD_STATE_DIR")
	if ((${#left[@]})); then
		gdd_log "left behind after down.sh: ${left[*]}"
		return 1
	fi
	gdd_log "down.sh left nothing behind"
}
