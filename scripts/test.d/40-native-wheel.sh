#!/usr/bin/env bash
# The Python package as pip users get it (issue 20): build the sdist and
# wheel, check their metadata with twine, install the wheel into a fresh
# venv at the lowest protobuf/grpcio/googleapis-common-protos/
# websocket-client that pyproject.toml allows, and run the store, gradient
# and weight-sync client tests and the etcd watch's from that venv against
# the real hub binary and etcd. The venv sees the
# machine's torch/pytest/safetensors (--system-site-packages; its own
# site-packages win), so it costs pip four small wheels, not PyTorch.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
work=$(mktemp -d /tmp/rlhub-wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Build from a copy so the checkout gets no build/ or egg-info.
cp -r python "$work/src"
rm -rf "$work/src/tests"
python3 -m build --no-isolation --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; exit 1; }
python3 -m twine check --strict "$work"/dist/*
# The licence: python/LICENSE is the root LICENSE, and both the wheel and
# the sdist carry it with the SPDX expression in their metadata.
cmp -s LICENSE python/LICENSE || { echo "wheel: python/LICENSE differs from LICENSE"; exit 1; }
python3 - "$work"/dist/*.whl "$work"/dist/*.tar.gz <<'PY'
import sys, tarfile, zipfile
whl, sdist = sys.argv[1], sys.argv[2]
lic = open("LICENSE", "rb").read()
z = zipfile.ZipFile(whl)
meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
assert "License-Expression: Apache-2.0" in meta.splitlines(), "wheel: no License-Expression: Apache-2.0"
assert "License-File: LICENSE" in meta.splitlines(), "wheel: no License-File"
lics = [n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
assert lics and z.read(lics[0]) == lic, f"wheel: licence text missing or different ({lics})"
with tarfile.open(sdist) as t:
    names = [m for m in t.getnames() if m.count("/") == 1 and m.endswith("/LICENSE")]
    assert names and t.extractfile(names[0]).read() == lic, f"sdist: licence text missing ({names})"
print(f"wheel: Apache-2.0 in the metadata; LICENSE in {whl.rsplit('/', 1)[-1]} and the sdist")
PY

python3 -m venv --system-site-packages "$work/venv"
py="$work/venv/bin/python"
pip=("$py" -m pip install -q --disable-pip-version-check)
# The lower bounds, read from the wheel's own metadata.
lows=$("$py" - "$work"/dist/*.whl <<'PY'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = z.read(next(n for n in z.namelist() if n.endswith("METADATA"))).decode()
want = {"grpcio", "protobuf", "googleapis-common-protos", "websocket-client"}
for line in meta.splitlines():
    m = re.match(r"Requires-Dist: ([\w-]+)\s*[<>=!,\d.\s]*?>=\s*([\d.]+)", line)
    if m and m.group(1) in want and "extra ==" not in line:
        print(f"{m.group(1)}=={m.group(2)}")
PY
)
[[ $(wc -w <<<"$lows") == 4 ]] || { echo "wheel: cannot read the lower bounds: $lows"; exit 1; }
echo "wheel: installing at $lows"
# shellcheck disable=SC2086
"${pip[@]}" --force-reinstall --no-deps $lows
"${pip[@]}" "$work"/dist/*.whl $lows

# Tests run from a copy of the test files, without PYTHONPATH: `import
# rlhub` must find the installed wheel.
mkdir "$work/tests"
cp python/tests/conftest.py python/tests/test_store.py python/tests/test_grads.py python/tests/test_wsync.py \
  python/tests/etcdproc.py python/tests/netlab.py python/tests/test_etcd_watch.py "$work/tests/"
cd "$work/tests"
env -u PYTHONPATH "$py" - $lows <<'PY'
import importlib.metadata as md, sys
from packaging.version import Version
for pin in sys.argv[1:]:  # the venv really runs the lower bounds
    name, want = pin.split("==")
    assert Version(md.version(name)) == Version(want), (name, md.version(name), want)
import google.protobuf, grpc, rlhub, rlhub.discover, rlhub.torchrl
assert "/venv/" in rlhub.__file__, rlhub.__file__
assert rlhub.__version__ == md.version("rlhub"), (rlhub.__version__, md.version("rlhub"))
print(f"wheel: rlhub {rlhub.__version__} from {rlhub.__file__}; protobuf {google.protobuf.__version__}, grpcio {grpc.__version__}")
PY
test -x "$work/venv/bin/rlhub-ars-worker"
env -u PYTHONPATH "$work/venv/bin/rlhub-ars-worker" --help >/dev/null
env -u PYTHONPATH RLHUB_BIN="$repo/bin/rlhub" "$py" -W error::RuntimeWarning -m pytest -q -p no:cacheprovider .
