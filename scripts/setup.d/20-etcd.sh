# etcd for the cluster tests (internal/cluster, `rlhub serve --etcd`):
# Debian's etcd-server. The tests start their own etcd processes on
# loopback ports; nothing runs as a service.
if ! command -v etcd >/dev/null; then
  echo "setup: installing etcd (Debian etcd-server) for the cluster tests"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq etcd-server >/dev/null
fi
