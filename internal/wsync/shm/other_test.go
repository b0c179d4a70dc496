//go:build !linux

package shm

// Off Linux no test re-executes this binary as a helper process (those
// tests are Linux only); TestMain still names the variable.
const childEnv = "RLHUB_WSYNC_CHILD"

func runChild() int { return 2 }
