# Sourced (not run) by the scripts that build or test Go code: when Debian's
# MuJoCo (libmujoco-dev) is installed, compile the MuJoCo binding
# (internal/mujoco, build tag "mujoco") so the locomotion environments work.
# Without it rlhub still builds; choosing a MuJoCo environment then fails
# with an error saying how to install MuJoCo. A GOFLAGS that already sets
# -tags is left alone.
if [[ -f /usr/include/mujoco/mujoco.h && "${GOFLAGS:-}" != *-tags* ]]; then
  export GOFLAGS="${GOFLAGS:+$GOFLAGS }-tags=mujoco"
fi
