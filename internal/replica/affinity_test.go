package replica_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// cpuSet is a set of CPU numbers, as taskset -c lists them.
type cpuSet []int

func (s cpuSet) String() string {
	var parts []string
	for _, c := range s {
		parts = append(parts, strconv.Itoa(c))
	}
	return strings.Join(parts, ",")
}

func (s cpuSet) unix() *unix.CPUSet {
	var set unix.CPUSet
	for _, c := range s {
		set.Set(c)
	}
	return &set
}

// ownCPUs is the CPUs this process may run on.
func ownCPUs() (cpuSet, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	var out cpuSet
	for c := range 1024 {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// pin restricts every thread of process pid (this process too: pid
// os.Getpid()) to set, as `taskset -a -p -c SET PID` does. A thread a
// pinned thread starts inherits its set, so once every thread is pinned
// the process stays pinned; the threads are listed again until no new one
// appeared during a pass.
func pin(pid int, set cpuSet) error {
	mask := set.unix()
	done := map[int]bool{}
	for pass := 0; pass < 10; pass++ {
		tids, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
		if err != nil {
			return fmt.Errorf("pin %d: %w", pid, err)
		}
		fresh := false
		for _, d := range tids {
			tid, err := strconv.Atoi(d.Name())
			if err != nil || done[tid] {
				continue
			}
			if err := unix.SchedSetaffinity(tid, mask); err != nil && err != unix.ESRCH {
				return fmt.Errorf("pin %d thread %d to %s: %w", pid, tid, set, err)
			}
			done[tid], fresh = true, true
		}
		if !fresh {
			return nil
		}
	}
	return nil
}

// childrenNamed lists this process's children whose command is name (the
// etcd a test started, say).
func childrenNamed(name string) []int {
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		fields := strings.Fields(s[close+1:])
		if len(fields) < 2 || s[open+1:close] != name {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == self {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}
