# Source after scripts/gotags.sh to link the Go MuJoCo binding against the
# libmujoco of pip's mujoco 2.3.7 wheel instead of Debian's libmujoco-dev
# 2.2.2: the same physics on Gymnasium's v5 models (internal/env/mjenv's
# reference and long-trajectory tests pass on both), about 1.8× the env
# steps per CPU-second, because Debian builds libmujoco for baseline x86-64
# (SSE2; no AVX instruction in libmujoco.so.2.2.2) and the wheel with clang
# and AVX (docs/mujoco.md, "Speed"). Uses the virtualenv of
# scripts/mujoco_check.sh ($RLHUB_MJ_VENV), creating it when missing;
# the binary finds the library by its rpath, so keep the venv.
#
#   source scripts/gotags.sh && source scripts/mujoco_fast.sh && go build -o bin/rlhub ./cmd/rlhub
_rl_venv=${RLHUB_MJ_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rlhub/venv-mujoco-2.3.7}
if ! "$_rl_venv/bin/python" -c 'import mujoco; assert mujoco.__version__ == "2.3.7"' 2>/dev/null; then
	python3 -m venv --system-site-packages "$_rl_venv" &&
		"$_rl_venv/bin/pip" install -q 'gymnasium[mujoco]==1.4.0' 'mujoco==2.3.7'
fi
_rl_pkg=$("$_rl_venv/bin/python" -c 'import mujoco, os; print(os.path.dirname(mujoco.__file__))' 2>/dev/null)
if [ -n "$_rl_pkg" ] && [ -f "$_rl_pkg/libmujoco.so.2.3.7" ] && [ -f "$_rl_pkg/include/mujoco/mujoco.h" ]; then
	# -lmujoco needs a file named libmujoco.so: a directory of links next to the venv.
	_rl_lib="$_rl_venv/rlhub-lib"
	mkdir -p "$_rl_lib"
	ln -sf "$_rl_pkg/libmujoco.so.2.3.7" "$_rl_lib/libmujoco.so"
	ln -sf "$_rl_pkg/libmujoco.so.2.3.7" "$_rl_lib/libmujoco.so.2.3.7"
	export CGO_CFLAGS="-I$_rl_pkg/include ${CGO_CFLAGS:-}"
	export CGO_LDFLAGS="-L$_rl_lib -Wl,-rpath,$_rl_lib ${CGO_LDFLAGS:-}"
else
	echo "mujoco_fast.sh: no mujoco 2.3.7 wheel in $_rl_venv; the build links Debian's libmujoco" >&2
fi
unset _rl_venv _rl_pkg _rl_lib
