package rlhub_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every client closed in the examples leaves no goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
