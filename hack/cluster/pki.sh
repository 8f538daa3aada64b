# shellcheck shell=bash
# Certificates and kubeconfigs for the local cluster, made with openssl. Sourced by
# up.sh after config.sh.

# gdd_cert NAME SUBJECT USAGE [SAN]: a P-256 key and a certificate signed by the
# cluster CA. USAGE is serverAuth, clientAuth or both comma-separated.
gdd_cert() {
	local name=$1 subj=$2 usage=$3 san=${4:-} ext
	ext=$GDD_PKI/$name.ext
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=$usage"
		[[ -n $san ]] && echo "subjectAltName=$san"
	} >"$ext"
	openssl ecparam -name prime256v1 -genkey -noout -out "$GDD_PKI/$name.key" 2>/dev/null
	openssl req -new -key "$GDD_PKI/$name.key" -subj "$subj" -out "$GDD_PKI/$name.csr" 2>/dev/null
	openssl x509 -req -in "$GDD_PKI/$name.csr" -CA "$GDD_PKI/ca.crt" -CAkey "$GDD_PKI/ca.key" \
		-CAcreateserial -days 3650 -sha256 -extfile "$ext" -out "$GDD_PKI/$name.crt" 2>/dev/null
	rm -f "$GDD_PKI/$name.csr" "$ext"
}

# gdd_kubeconfig FILE CERT-NAME [SERVER]: a kubeconfig with embedded credentials,
# so it can be copied elsewhere. SERVER defaults to the loopback API server.
gdd_kubeconfig() {
	local file=$1 name=$2 server=${3:-https://127.0.0.1:$GDD_APISERVER_PORT}
	cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gdd
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 <"$GDD_PKI/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(base64 -w0 <"$GDD_PKI/$name.crt")
    client-key-data: $(base64 -w0 <"$GDD_PKI/$name.key")
contexts:
- name: gdd
  context:
    cluster: gdd
    user: $name
current-context: gdd
EOF
	chmod 600 "$file"
}

gdd_make_pki() {
	mkdir -p "$GDD_PKI"
	chmod 700 "$GDD_PKI"
	openssl ecparam -name prime256v1 -genkey -noout -out "$GDD_PKI/ca.key" 2>/dev/null
	openssl req -x509 -new -key "$GDD_PKI/ca.key" -subj "/CN=gpu-dra-driver-local-ca" -days 3650 -sha256 \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
		-out "$GDD_PKI/ca.crt" 2>/dev/null

	local host_ips san
	host_ips=$(ip -4 -o addr show scope global | awk -v skip="$GDD_HOST_IP" '{split($4, a, "/"); if (a[1] != skip) printf ",IP:%s", a[1]}')
	san="DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
	san+=",DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:$GDD_SERVICE_IP,IP:$GDD_HOST_IP$host_ips"
	gdd_cert apiserver "/CN=kube-apiserver" serverAuth "$san"
	gdd_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
	gdd_cert front-proxy-client "/CN=front-proxy-client" clientAuth
	gdd_cert admin "/O=system:masters/CN=kubernetes-admin" clientAuth
	gdd_cert controller-manager "/CN=system:kube-controller-manager" clientAuth
	gdd_cert scheduler "/CN=system:kube-scheduler" clientAuth
	local node
	for node in $(gdd_node_names); do
		gdd_cert "kubelet-$node" "/O=system:nodes/CN=system:node:$node" clientAuth
	done

	# Service-account token signing key pair.
	openssl genrsa -out "$GDD_PKI/sa.key" 2048 2>/dev/null
	openssl rsa -in "$GDD_PKI/sa.key" -pubout -out "$GDD_PKI/sa.pub" 2>/dev/null

	mkdir -p "$GDD_KUBECONFIG"
	local n
	for n in admin controller-manager scheduler; do
		gdd_kubeconfig "$GDD_KUBECONFIG/$n.kubeconfig" "$n"
	done
	# The nodes reach the API server through the host bridge (config.sh).
	for node in $(gdd_node_names); do
		gdd_kubeconfig "$GDD_KUBECONFIG/kubelet-$node.kubeconfig" "kubelet-$node" "https://$GDD_HOST_IP:$GDD_APISERVER_PORT"
	done
}
