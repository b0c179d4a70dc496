package wire

import (
	"testing"

	"go.uber.org/goleak"
)

// The gRPC benchmarks start servers and connections; every goroutine they
// start must be gone when the package's tests end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
