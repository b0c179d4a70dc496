// Package mujoco binds the MuJoCo physics library (Debian's libmujoco-dev,
// MuJoCo 2.2.2; or, built after `source scripts/mujoco_fast.sh`, the faster
// libmujoco 2.3.7 of pip's mujoco wheel) with cgo: load a model from MJCF
// XML, make its simulation data, step it, and view the state arrays as Go
// slices without copying.
//
// The binding is compiled only with the build tag "mujoco" (and cgo), so the
// rest of rlhub builds and tests with a plain `go build` on a machine
// without MuJoCo. Without the tag every constructor returns an error
// wrapping ErrNotInstalled whose text says how to install the library and
// rebuild; Available reports which variant was compiled. The repository's
// scripts and Makefile pass -tags=mujoco when /usr/include/mujoco/mujoco.h
// exists.
//
// Use:
//  1. LoadXML a model; it is read-only afterwards and may be shared by
//     several Data.
//  2. NewData for each simulation that steps the model.
//  3. Write Ctrl (and QPos/QVel to set a state, then Forward), call Step.
//  4. Close the Data, then the Model. Slices obtained from either point
//     into C memory and must not be used after Close.
//
// A Model or Data is not safe for concurrent use; distinct Data (even of
// one Model) may be stepped in parallel.
package mujoco

import "errors"

// ErrNotInstalled is wrapped by every constructor of a build without the
// MuJoCo binding.
var ErrNotInstalled = errors.New("mujoco: this rlhub was built without MuJoCo")

// InstallHint says how to get a build with MuJoCo; it is part of the error
// returned when MuJoCo is missing.
const InstallHint = "install Debian's MuJoCo (apt-get install -y libmujoco-dev) " +
	"and rebuild with the build tag: go build -tags mujoco ./... " +
	"(make build and scripts/test.sh add the tag when /usr/include/mujoco/mujoco.h exists)"
