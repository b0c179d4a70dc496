# iproute2 for the tests that run "machines" in network namespaces
# (internal/testkit's Lab: a bridge, veth pairs, one namespace per host).
if ! command -v ip >/dev/null; then
  echo "setup: installing iproute2 for the network-namespace tests"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq iproute2 >/dev/null
fi
