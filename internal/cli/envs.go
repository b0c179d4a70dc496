package cli

// Linked in for their env.Register side effect, so every subcommand that
// takes an environment name (env.Make) also knows the MuJoCo locomotion
// tasks. Without the mujoco build tag they are still listed, and choosing
// one fails with an error saying how to install MuJoCo.
import (
	_ "github.com/rlhub/rlhub/internal/env/dictreach"
	_ "github.com/rlhub/rlhub/internal/env/mjenv"
)
