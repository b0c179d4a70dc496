package clustertest

import (
	"testing"

	"go.uber.org/goleak"
)

// The helpers start goroutines (one waits on each etcd process); every
// one must be gone once its test is.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
