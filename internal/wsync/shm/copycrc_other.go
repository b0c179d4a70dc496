//go:build !amd64 || purego

package shm

// fusedOK is false: there is no fused copy + CRC kernel for this
// architecture, and copyCRCUpdate copies, then checksums.
const fusedOK = false

func copyCRC3(dst, src *byte, part int, crcs *[3]uint32, nt bool) {
	panic("shm: copyCRC3 without a kernel")
}
