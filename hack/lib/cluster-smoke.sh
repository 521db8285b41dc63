#!/usr/bin/env bash
# Proves a fresh cluster works end to end with a locally built image: a pod serves HTTP, another
# pod reaches it through the Service's ClusterIP and through its DNS name.
#
#   hack/lib/cluster-smoke.sh KUBECONFIG IMAGE     (hack/local-cluster.sh smoke runs it)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tools.sh"

KUBECONFIG=$1
IMAGE=$2
NS=gymkube-smoke
export KUBECONFIG
k() { "$GYMKUBE_BIN_DIR/kubectl" "$@"; }
log() { printf 'smoke: %s\n' "$*" >&2; }
fail() {
	log "FAILED: $*"
	k -n "$NS" get pods,svc,endpointslices -o wide >&2 || true
	k -n "$NS" describe pods >&2 || true
	k -n "$NS" get events --sort-by=.lastTimestamp >&2 || true
	exit 1
}

start=$SECONDS
k delete namespace "$NS" --ignore-not-found --wait >/dev/null
k create namespace "$NS" >/dev/null
k -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers:
  - name: httpd
    image: $IMAGE
    imagePullPolicy: Never
    command: [sh, -c, 'echo hello-from-web > /www/index.html && exec httpd -f -p 8080 -h /www']
    ports: [{containerPort: 8080}]
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  containers:
  - name: client
    image: $IMAGE
    imagePullPolicy: Never
    command: [sh, -c, 'exec sleep 3600']
YAML
k -n "$NS" wait --for=condition=Ready pod/web pod/client --timeout=120s >/dev/null || fail "pods not Ready"
log "pods Ready after $((SECONDS - start))s"

cluster_ip=$(k -n "$NS" get service web -o jsonpath='{.spec.clusterIP}')
fqdn=web.$NS.svc.cluster.local
# kube-proxy programs the Service a moment after the endpoints appear: poll, bounded.
# busybox nc, not wget: Debian's static busybox wget crashes (static glibc).
for host in "$cluster_ip" "$fqdn"; do
	deadline=$((SECONDS + 60))
	until k -n "$NS" exec client -- sh -c "printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 2 $host 80" 2>/dev/null |
		grep -x hello-from-web >/dev/null; do
		((SECONDS < deadline)) || fail "client could not fetch http://$host/"
		sleep 1
	done
	log "client fetched http://$host/"
done
k -n "$NS" exec client -- nslookup "$fqdn" | grep "$cluster_ip" >/dev/null || fail "$fqdn does not resolve to $cluster_ip"
log "$fqdn resolves to $cluster_ip"
k delete namespace "$NS" --wait=false >/dev/null
log "passed in $((SECONDS - start))s"
