package storebench

import (
	"testing"

	"go.uber.org/goleak"
)

// The benchmarks start a hub, readers and a plain-TCP copy server; each
// must be stopped and waited for by the benchmark that started it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
