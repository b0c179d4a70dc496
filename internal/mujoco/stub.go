//go:build !(mujoco && cgo)

package mujoco

import "fmt"

// Available reports whether this build contains the MuJoCo binding.
const Available = false

// Version is the linked MuJoCo version; empty without the binding.
func Version() string { return "" }

// Library is the path of the linked libmujoco; empty without the binding.
func Library() string { return "" }

// Model is a compiled MuJoCo model. Without the binding it cannot be made.
type Model struct {
	Nq, Nv, Nu, Na, Nbody int
}

// Data is the simulation state of a Model. Without the binding it cannot
// be made.
type Data struct{}

func notInstalled() error { return fmt.Errorf("%w: %s", ErrNotInstalled, InstallHint) }

// LoadXML returns an error wrapping ErrNotInstalled.
func LoadXML(path string) (*Model, error) { return nil, notInstalled() }

// NewData returns an error wrapping ErrNotInstalled.
func NewData(m *Model) (*Data, error) { return nil, notInstalled() }

// The methods below exist so that code using the binding compiles without
// it; no Model or Data value can be obtained, so they are never reached.

func (m *Model) Close()                        {}
func (m *Model) Timestep() float64             { return 0 }
func (m *Model) QPos0() []float64              { return nil }
func (m *Model) BodyMass() []float64           { return nil }
func (m *Model) CtrlRange() (lo, hi []float64) { return nil, nil }
func (d *Data) Close()                         {}
func (d *Data) QPos() []float64                { return nil }
func (d *Data) QVel() []float64                { return nil }
func (d *Data) Act() []float64                 { return nil }
func (d *Data) Ctrl() []float64                { return nil }
func (d *Data) XPos() []float64                { return nil }
func (d *Data) XIPos() []float64               { return nil }
func (d *Data) CInert() []float64              { return nil }
func (d *Data) CVel() []float64                { return nil }
func (d *Data) CFrcExt() []float64             { return nil }
func (d *Data) QFrcActuator() []float64        { return nil }
func (d *Data) QAccWarmstart() []float64       { return nil }
func (d *Data) NCon() int                      { return 0 }
func (d *Data) Reset()                         {}
func (d *Data) Forward()                       {}
func (d *Data) Step(n int)                     {}
func (d *Data) RNEPostConstraint()             {}
