//go:build mujoco && cgo

package mujoco

/*
#cgo LDFLAGS: -lmujoco -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <mujoco/mujoco.h>

// rl_warning replaces MuJoCo's default warning handler, which appends to
// MUJOCO_LOG.TXT in the working directory.
static void rl_warning(const char* msg) { fprintf(stderr, "mujoco: warning: %s\n", msg); }
static void rl_install_handlers(void) { mju_user_warning = rl_warning; }

// rl_library is the file the dynamic loader mapped mj_versionString from:
// the libmujoco this process runs, whichever -L or rpath picked it.
static const char* rl_library(void) {
	Dl_info info;
	if (dladdr((void*)mj_versionString, &info) == 0 || info.dli_fname == NULL) return "";
	return info.dli_fname;
}

static void rl_step(const mjModel* m, mjData* d, int n) {
	for (int i = 0; i < n; i++) mj_step(m, d);
}
*/
import "C"

import (
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"unsafe"
)

// Available reports whether this build contains the MuJoCo binding.
const Available = true

func init() { C.rl_install_handlers() }

// Version is the linked MuJoCo version, e.g. "2.2.2".
func Version() string { return C.GoString(C.mj_versionString()) }

// Library is the path of the linked libmujoco as loaded, with symbolic links
// resolved: Debian's /usr/lib/…/libmujoco.so.2.2.2, or the pip wheel's
// site-packages/mujoco/libmujoco.so.2.3.7 for a build after
// scripts/mujoco_fast.sh. Version says which release; Library says which
// build of it (the two differ in speed, not in physics: docs/mujoco.md).
func Library() string {
	p := C.GoString(C.rl_library())
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}

// loadMu serializes model compilation: MuJoCo 2.2.2 does not document
// mj_loadXML as safe to call concurrently.
var loadMu sync.Mutex

// Model is a compiled MuJoCo model (mjModel). Its sizes are fixed at load.
type Model struct {
	m                     *C.mjModel
	cleanup               runtime.Cleanup
	Nq, Nv, Nu, Na, Nbody int
}

// LoadXML compiles the MJCF file at path. Compiler errors are returned with
// MuJoCo's message.
func LoadXML(path string) (*Model, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var errbuf [1024]C.char
	loadMu.Lock()
	m := C.mj_loadXML(cpath, nil, &errbuf[0], C.int(len(errbuf)))
	loadMu.Unlock()
	if m == nil {
		return nil, fmt.Errorf("mujoco: load %s: %s", path, C.GoString(&errbuf[0]))
	}
	md := &Model{m: m, Nq: int(m.nq), Nv: int(m.nv), Nu: int(m.nu), Na: int(m.na), Nbody: int(m.nbody)}
	md.cleanup = runtime.AddCleanup(md, func(m *C.mjModel) { C.mj_deleteModel(m) }, m)
	return md, nil
}

// Close frees the model. Close every Data of the model first. Calling Close
// twice is safe.
func (m *Model) Close() {
	if m.m == nil {
		return
	}
	m.cleanup.Stop()
	C.mj_deleteModel(m.m)
	m.m = nil
}

// Timestep is the simulation timestep (opt.timestep) in seconds.
func (m *Model) Timestep() float64 { return float64(m.m.opt.timestep) }

// QPos0 is the reference configuration (qpos0, length Nq). The slice points
// into the model and is valid until Close; do not write to it.
func (m *Model) QPos0() []float64 { return view(m.m.qpos0, m.Nq) }

// BodyMass is each body's mass (length Nbody), valid until Close.
func (m *Model) BodyMass() []float64 { return view(m.m.body_mass, m.Nbody) }

// CtrlRange returns fresh copies of each actuator's control bounds
// (actuator_ctrlrange, as Gymnasium reads it for the action space).
func (m *Model) CtrlRange() (lo, hi []float64) {
	r := view(m.m.actuator_ctrlrange, 2*m.Nu)
	lo, hi = make([]float64, m.Nu), make([]float64, m.Nu)
	for i := range m.Nu {
		lo[i], hi[i] = r[2*i], r[2*i+1]
	}
	return lo, hi
}

// Data is the simulation state of one Model (mjData). The accessor slices
// alias C memory: writes go straight into the simulation, and they are
// valid until Close.
type Data struct {
	model   *Model
	d       *C.mjData
	cleanup runtime.Cleanup

	qpos, qvel, act, ctrl, xpos, xipos, cinert, cvel, cfrcExt, qfrcActuator, qaccWarmstart []float64
}

// NewData makes simulation data for m in its reference state (as
// mj_makeData: qpos = qpos0, everything else zero, no forward pass yet).
func NewData(m *Model) (*Data, error) {
	if m == nil || m.m == nil {
		return nil, fmt.Errorf("mujoco: NewData of a nil or closed model")
	}
	d := C.mj_makeData(m.m)
	if d == nil {
		return nil, fmt.Errorf("mujoco: mj_makeData failed (out of memory?)")
	}
	dd := &Data{model: m, d: d}
	dd.cleanup = runtime.AddCleanup(dd, func(d *C.mjData) { C.mj_deleteData(d) }, d)
	nb := m.Nbody
	dd.qpos = view(d.qpos, m.Nq)
	dd.qvel = view(d.qvel, m.Nv)
	dd.act = view(d.act, m.Na)
	dd.ctrl = view(d.ctrl, m.Nu)
	dd.xpos = view(d.xpos, 3*nb)
	dd.xipos = view(d.xipos, 3*nb)
	dd.cinert = view(d.cinert, 10*nb)
	dd.cvel = view(d.cvel, 6*nb)
	dd.cfrcExt = view(d.cfrc_ext, 6*nb)
	dd.qfrcActuator = view(d.qfrc_actuator, m.Nv)
	dd.qaccWarmstart = view(d.qacc_warmstart, m.Nv)
	return dd, nil
}

// Close frees the data; the accessor slices become invalid. Calling Close
// twice is safe.
func (d *Data) Close() {
	if d.d == nil {
		return
	}
	d.cleanup.Stop()
	C.mj_deleteData(d.d)
	d.d = nil
	d.qpos, d.qvel, d.act, d.ctrl, d.xpos, d.xipos, d.cinert, d.cvel, d.cfrcExt, d.qfrcActuator, d.qaccWarmstart = nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil
}

// QPos is the generalized position (Nq).
func (d *Data) QPos() []float64 { return d.qpos }

// QVel is the generalized velocity (Nv).
func (d *Data) QVel() []float64 { return d.qvel }

// Act is the actuator activation (Na).
func (d *Data) Act() []float64 { return d.act }

// Ctrl is the control input (Nu). MuJoCo clamps it to the control range of
// ctrllimited actuators when it applies it, without writing back.
func (d *Data) Ctrl() []float64 { return d.ctrl }

// XPos is each body's Cartesian frame position (Nbody×3).
func (d *Data) XPos() []float64 { return d.xpos }

// XIPos is each body's Cartesian centre of mass (Nbody×3).
func (d *Data) XIPos() []float64 { return d.xipos }

// CInert is each body's com-based inertia and mass (Nbody×10).
func (d *Data) CInert() []float64 { return d.cinert }

// CVel is each body's com-based velocity (Nbody×6).
func (d *Data) CVel() []float64 { return d.cvel }

// CFrcExt is each body's com-based external force (Nbody×6); current only
// after RNEPostConstraint.
func (d *Data) CFrcExt() []float64 { return d.cfrcExt }

// QFrcActuator is the actuator force in generalized coordinates (Nv).
func (d *Data) QFrcActuator() []float64 { return d.qfrcActuator }

// QAccWarmstart is the constraint solver's warm start (Nv): the
// acceleration of the last step, which the next step's solver starts from.
// Writing it with the state reproduces another simulation's next step
// exactly (Gymnasium's set_state leaves it alone).
func (d *Data) QAccWarmstart() []float64 { return d.qaccWarmstart }

// NCon is the number of contacts the last collision pass found.
func (d *Data) NCon() int {
	d.live()
	n := int(d.d.ncon)
	runtime.KeepAlive(d)
	return n
}

// Reset restores the reference state (mj_resetData).
func (d *Data) Reset() {
	d.live()
	C.mj_resetData(d.model.m, d.d)
	runtime.KeepAlive(d)
}

// Forward computes all derived quantities of the current state without
// advancing time (mj_forward).
func (d *Data) Forward() {
	d.live()
	C.mj_forward(d.model.m, d.d)
	runtime.KeepAlive(d)
}

// Step advances the simulation by n timesteps (n calls of mj_step) in one
// cgo call.
func (d *Data) Step(n int) {
	d.live()
	C.rl_step(d.model.m, d.d, C.int(n))
	runtime.KeepAlive(d)
}

// RNEPostConstraint computes cacc, cfrc_int and cfrc_ext for the current
// state (mj_rnePostConstraint).
func (d *Data) RNEPostConstraint() {
	d.live()
	C.mj_rnePostConstraint(d.model.m, d.d)
	runtime.KeepAlive(d)
}

// live panics, instead of letting C dereference freed memory, when d or
// its model was closed: that is a bug in the caller.
func (d *Data) live() {
	if d.d == nil || d.model.m == nil {
		panic("mujoco: use of closed Data or Model")
	}
}

// view aliases n float64 values of C memory at p (nil when n is 0).
func view(p *C.mjtNum, n int) []float64 {
	if n == 0 || p == nil {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(p)), n)
}
