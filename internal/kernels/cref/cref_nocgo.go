//go:build !cgo

package cref

// Available reports whether the C reference was compiled in.
const Available = false

// Add panics: the C reference needs cgo. Check Available first.
func Add(dst, x []float32) { panic("cref: built without cgo") }
