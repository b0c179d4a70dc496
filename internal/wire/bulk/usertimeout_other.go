//go:build !linux

package bulk

import "syscall"

// setUserTimeout does nothing where TCP_USER_TIMEOUT is not offered: the
// keep-alives alone find a dead peer of an idle wait.
func setUserTimeout(_, _ string, _ syscall.RawConn) error { return nil }
