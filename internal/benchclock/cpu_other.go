//go:build !linux

package benchclock

import "time"

const hasCPU = false

func threadCPU() time.Duration { return 0 }
