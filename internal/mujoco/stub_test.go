//go:build !(mujoco && cgo)

package mujoco

import (
	"errors"
	"strings"
	"testing"
)

func TestWithoutMuJoCo(t *testing.T) {
	if Available {
		t.Fatal("Available is true in a build without the mujoco tag")
	}
	_, err := LoadXML("/nonexistent.xml")
	if !errors.Is(err, ErrNotInstalled) {
		t.Fatalf("LoadXML error = %v, want ErrNotInstalled", err)
	}
	for _, want := range []string{"apt-get install -y libmujoco-dev", "-tags mujoco"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := NewData(nil); !errors.Is(err, ErrNotInstalled) {
		t.Errorf("NewData error = %v, want ErrNotInstalled", err)
	}
	if Version() != "" || Library() != "" {
		t.Errorf("Version() = %q, Library() = %q without the binding, want both empty", Version(), Library())
	}
}
