//go:build mujoco && cgo

package mujoco

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// boxXML is a free-floating box above a plane plus a motor-driven hinged
// pendulum: small, but it has a quaternion, contacts and an actuator.
const boxXML = `<mujoco>
  <option timestep="0.002"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1"/>
    <body name="box" pos="0 0 1">
      <freejoint/>
      <geom type="box" size="0.1 0.1 0.1" mass="1"/>
    </body>
    <body name="arm" pos="2 0 1">
      <joint name="hinge" type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.05" mass="2"/>
    </body>
  </worldbody>
  <actuator>
    <motor joint="hinge" ctrllimited="true" ctrlrange="-0.5 0.5" gear="10"/>
  </actuator>
</mujoco>`

func loadBox(t *testing.T) (*Model, *Data) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "box.xml")
	if err := os.WriteFile(path, []byte(boxXML), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := LoadXML(path)
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewData(m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(); m.Close() })
	return m, d
}

func TestModelSizes(t *testing.T) {
	if !Available || Version() == "" {
		t.Fatalf("Available = %v, Version() = %q in a build with the mujoco tag", Available, Version())
	}
	m, d := loadBox(t)
	got := [5]int{m.Nq, m.Nv, m.Nu, m.Na, m.Nbody}
	if want := [5]int{8, 7, 1, 0, 3}; got != want {
		t.Errorf("nq, nv, nu, na, nbody = %v, want %v", got, want)
	}
	if m.Timestep() != 0.002 {
		t.Errorf("Timestep() = %v, want 0.002", m.Timestep())
	}
	lo, hi := m.CtrlRange()
	if len(lo) != 1 || lo[0] != -0.5 || hi[0] != 0.5 {
		t.Errorf("CtrlRange() = %v, %v; want [-0.5] [0.5]", lo, hi)
	}
	if q0 := m.QPos0(); q0[2] != 1 || q0[3] != 1 {
		t.Errorf("QPos0() = %v, want box at z=1 with identity quaternion", q0)
	}
	if mass := m.BodyMass(); mass[1] != 1 || mass[2] != 2 {
		t.Errorf("BodyMass() = %v, want [0 1 2]", mass)
	}
	lens := []int{len(d.QPos()), len(d.QVel()), len(d.Ctrl()), len(d.XPos()), len(d.XIPos()),
		len(d.CInert()), len(d.CVel()), len(d.CFrcExt()), len(d.QFrcActuator())}
	if want := []int{8, 7, 1, 9, 9, 30, 18, 18, 7}; !equalInts(lens, want) {
		t.Errorf("slice lengths = %v, want %v", lens, want)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Library names the libmujoco file this process has mapped (as the loader
// sees it in /proc/self/maps), not a guess from the build flags.
func TestLibraryIsTheMappedLibmujoco(t *testing.T) {
	lib := Library()
	if !filepath.IsAbs(lib) || !strings.HasPrefix(filepath.Base(lib), "libmujoco") {
		t.Fatalf("Library() = %q, want an absolute path to a libmujoco file", lib)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	var mapped []string
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.Contains(filepath.Base(f[5]), "libmujoco") {
			continue
		}
		p, err := filepath.EvalSymlinks(f[5])
		if err != nil {
			t.Fatal(err)
		}
		if p == lib {
			t.Logf("MuJoCo %s from %s", Version(), lib)
			return
		}
		mapped = append(mapped, p)
	}
	t.Fatalf("Library() = %q is not mapped; mapped libmujoco files: %q", lib, mapped)
}

func TestStepFallsAndLands(t *testing.T) {
	_, d := loadBox(t)
	d.Forward()
	d.Step(1000) // 2 s: the box falls 0.9 m and rests on the floor
	d.RNEPostConstraint()
	if z := d.QPos()[2]; z < 0.09 || z > 0.11 {
		t.Errorf("box height after 2 s = %v, want resting at 0.1", z)
	}
	// Resting: the floor pushes up with the box's weight (m·g = 9.81 N) in
	// cfrc_ext's force part (indices 3..5 of the body's 6-vector).
	if fz := d.CFrcExt()[6+5]; fz < 9 || fz > 10.5 {
		t.Errorf("contact force on the box = %v N, want ~9.81", fz)
	}
	d.Reset()
	if z := d.QPos()[2]; z != 1 {
		t.Errorf("after Reset box height = %v, want 1", z)
	}
}

func TestCtrlIsClampedByMuJoCo(t *testing.T) {
	_, d := loadBox(t)
	run := func(u float64) float64 {
		d.Reset()
		d.Ctrl()[0] = u
		d.Step(1)
		return d.QFrcActuator()[6]
	}
	atLimit, beyond := run(0.5), run(5)
	if atLimit != 5 || beyond != atLimit {
		t.Errorf("actuator force for ctrl 0.5 = %v, for ctrl 5 = %v; want both 5 (gear 10 × clamped 0.5)", atLimit, beyond)
	}
}

func TestLoadErrors(t *testing.T) {
	if _, err := LoadXML(filepath.Join(t.TempDir(), "missing.xml")); err == nil {
		t.Error("LoadXML of a missing file succeeded")
	}
	bad := filepath.Join(t.TempDir(), "bad.xml")
	os.WriteFile(bad, []byte("<mujoco><worldbody><body><geom type='nosuch'/></body></worldbody></mujoco>"), 0o644)
	_, err := LoadXML(bad)
	if err == nil || !strings.Contains(err.Error(), "bad.xml") {
		t.Errorf("LoadXML of invalid XML: err = %v, want an error naming the file", err)
	}
	if _, err := NewData(nil); err == nil {
		t.Error("NewData(nil) succeeded")
	}
}

func TestCloseTwiceAndUseAfterClose(t *testing.T) {
	m, d := loadBox(t)
	d.Close()
	d.Close()
	m.Close()
	m.Close()
	defer func() {
		if r := recover(); r == nil {
			t.Error("Step on a closed Data did not panic")
		}
	}()
	d.Step(1)
}

// TestParallelData steps two Data of one Model from two goroutines; with
// -race this checks the binding shares nothing mutable between them.
func TestParallelData(t *testing.T) {
	m, d1 := loadBox(t)
	d2, err := NewData(m)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	done := make(chan float64)
	for _, d := range []*Data{d1, d2} {
		go func() {
			d.Ctrl()[0] = 0.3
			d.Step(500)
			done <- d.QPos()[7]
		}()
	}
	a, b := <-done, <-done
	if a != b {
		t.Errorf("same model, same inputs, different results: %v vs %v", a, b)
	}
}
