# shellcheck shell=bash
# Certificates and kubeconfigs for the local cluster: one CA signs every serving and client
# certificate (openssl only). Sourced by hack/local-cluster.sh after cluster-common.sh.

# sign_cert NAME SUBJECT EXTENSIONS: writes NAME.{crt,key} signed by the cluster CA.
sign_cert() {
	local name=$1 subject=$2 extensions=$3
	[[ -f $PKI_DIR/$name.crt ]] && return 0
	openssl req -new -nodes -newkey rsa:2048 -keyout "$PKI_DIR/$name.key" -subj "$subject" \
		-out "$PKI_DIR/$name.csr" 2>/dev/null
	openssl x509 -req -in "$PKI_DIR/$name.csr" -CA "$PKI_DIR/ca.crt" -CAkey "$PKI_DIR/ca.key" \
		-CAcreateserial -days 3650 -sha256 -extfile <(printf '%s\n' "$extensions") \
		-out "$PKI_DIR/$name.crt" 2>/dev/null
	rm -f "$PKI_DIR/$name.csr"
}

client_cert() {
	local name=$1 user=$2 group=${3:-}
	local subject="/CN=$user"
	[[ -n $group ]] && subject="/O=$group$subject"
	sign_cert "$name" "$subject" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
}

# write_kubeconfig NAME: kubeconfig authenticating with client cert NAME.crt, certs embedded.
write_kubeconfig() {
	local name=$1 out=${2:-$CONF_DIR/$1.kubeconfig}
	cat >"$out" <<-KUBECONFIG
		apiVersion: v1
		kind: Config
		clusters:
		- name: gymkube-local
		  cluster:
		    server: https://127.0.0.1:$APISERVER_PORT
		    certificate-authority-data: $(base64 -w0 "$PKI_DIR/ca.crt")
		users:
		- name: $name
		  user:
		    client-certificate-data: $(base64 -w0 "$PKI_DIR/$name.crt")
		    client-key-data: $(base64 -w0 "$PKI_DIR/$name.key")
		contexts:
		- name: gymkube-local
		  context: {cluster: gymkube-local, user: $name}
		current-context: gymkube-local
	KUBECONFIG
	chmod 600 "$out"
}

ensure_pki() {
	local ip=$1
	mkdir -p "$PKI_DIR" "$CONF_DIR"
	chmod 700 "$PKI_DIR"
	if [[ ! -f $PKI_DIR/ca.crt ]]; then
		openssl req -x509 -new -nodes -newkey rsa:2048 -sha256 -days 3650 \
			-keyout "$PKI_DIR/ca.key" -out "$PKI_DIR/ca.crt" -subj "/CN=gymkube-local-ca" 2>/dev/null
	fi
	[[ -f $PKI_DIR/service-account.key ]] || openssl genrsa -out "$PKI_DIR/service-account.key" 2048 2>/dev/null
	# The serving certificate names the host address, which can change between boots.
	if [[ -f $PKI_DIR/apiserver.crt ]] && ! openssl x509 -in "$PKI_DIR/apiserver.crt" -noout -ext subjectAltName |
		grep "IP Address:$ip\b" >/dev/null; then
		rm -f "$PKI_DIR/apiserver.crt"
	fi
	sign_cert apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN,DNS:localhost,IP:127.0.0.1,IP:$SERVICE_FIRST_IP,IP:$ip"
	client_cert apiserver-kubelet-client kube-apiserver
	client_cert admin gymkube-admin system:masters
	client_cert controller-manager system:kube-controller-manager
	client_cert scheduler system:kube-scheduler
	client_cert kubelet "system:node:$NODE_NAME" system:nodes
	client_cert kube-proxy system:kube-proxy
	local name
	for name in admin controller-manager scheduler kubelet kube-proxy; do
		write_kubeconfig "$name"
	done
	cp "$CONF_DIR/admin.kubeconfig" "$KUBECONFIG_PATH"
	chmod 600 "$KUBECONFIG_PATH"
}
