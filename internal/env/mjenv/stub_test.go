//go:build !(mujoco && cgo)

package mjenv

import (
	"errors"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/env"
	"github.com/rlhub/rlhub/internal/mujoco"
)

// TestWithoutMuJoCo: in a build without MuJoCo the tasks are registered and
// choosing one fails with an error that says how to install MuJoCo.
func TestWithoutMuJoCo(t *testing.T) {
	for _, name := range Names() {
		ctor, ok := env.Lookup(name)
		if !ok {
			t.Fatalf("%s not registered", name)
		}
		_, err := ctor()
		if !errors.Is(err, mujoco.ErrNotInstalled) || !strings.Contains(err.Error(), "apt-get install -y libmujoco-dev") ||
			!strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v, want ErrNotInstalled naming the task and the install command", name, err)
		}
	}
	if _, err := env.Make("Hopper-v5"); !errors.Is(err, mujoco.ErrNotInstalled) {
		t.Errorf("env.Make(Hopper-v5) err = %v, want ErrNotInstalled", err)
	}
	if _, err := New("Cheetah-v9", Options{}); err == nil || !strings.Contains(err.Error(), "HalfCheetah-v5") {
		t.Errorf("unknown task: err = %v, want the list of known tasks", err)
	}
}
