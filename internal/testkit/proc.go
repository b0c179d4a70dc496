package testkit

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Buffer is a bytes.Buffer safe for concurrent writes and reads: a
// process's output, or a logger's sink that a test reads while the
// component still writes.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// Binary is the rlhub binary for tests that start real processes:
// $RLHUB_BIN when set, otherwise ./cmd/rlhub of this module, built (with
// the environment's GOFLAGS, so build tags carry over) once per test
// binary into a temporary directory. Wrap TestMain's m in Main so that the
// directory is removed when the tests end.
func Binary(tb testing.TB) string {
	tb.Helper()
	if b := os.Getenv("RLHUB_BIN"); b != "" {
		return b
	}
	binOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			binErr = fmt.Errorf("go env GOMOD: %v", err)
			return
		}
		root := filepath.Dir(strings.TrimSpace(string(out)))
		if binDir, err = os.MkdirTemp("", "rlhub-testbin-"); err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(binDir, "rlhub")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/rlhub")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/rlhub: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		tb.Fatal(binErr)
	}
	return binPath
}

// Main wraps a TestMain's m so that, once the tests have run, the binary
// Binary built is removed:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(testkit.Main(m)) }
//
// or, without goleak, os.Exit(testkit.Main(m).Run()).
func Main(m interface{ Run() int }) interface{ Run() int } { return mainM{m} }

type mainM struct{ m interface{ Run() int } }

func (w mainM) Run() int {
	code := w.m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	return code
}

// ProcConfig says what StartProc starts.
type ProcConfig struct {
	// Name labels the process in failures and in its logged output
	// ("hub h1"); "" means the executable's base name.
	Name string
	// Path is the executable; "" means Binary(tb).
	Path string
	// Args are the process's arguments.
	Args []string
	// Env is added to this test process's environment.
	Env []string
	// AddrFile, when set, is the file the process writes its address to
	// (the caller passes it, e.g. as `serve --addr-file`): StartProc
	// returns once the file holds a line ending in "\n", and fails the
	// test if the process exits first or StartTimeout passes. Addr
	// returns what it read.
	AddrFile string
	// StartTimeout bounds the wait for AddrFile; zero means 60s.
	StartTimeout time.Duration
	// Wrap, when set, is a command that runs the process by exec'ing
	// Path with Args (`ip netns exec NS …`: Host.Start): the pid stays the
	// program's own, so signals and the SIGQUIT at a failure reach it.
	Wrap []string
}

// waitDelay bounds how long reaping a process waits for its output after
// it has exited: a grandchild that kept the pipe open (a `train ars`
// worker) does not hold the test.
const waitDelay = 10 * time.Second

// outputTail is how much of a process's output a failed test logs.
const outputTail = 256 << 10

// Proc is a process a test started. Its stdout and stderr go to one
// Buffer; a goroutine owned by the Proc reaps it. At cleanup it is
// SIGKILLed (after a SIGCONT, in case the test stopped it) and reaped,
// and if the test failed its output is logged (an rlhub process still
// running is sent SIGQUIT first, so the output ends with its goroutines).
type Proc struct {
	name string
	cmd  *exec.Cmd
	out  *Buffer
	addr string
	done chan struct{} // closed once the process has exited and its output is read
}

// StartProc starts cfg's process, ties it to tb's cleanup, and with
// cfg.AddrFile waits until it has published its address.
func StartProc(tb testing.TB, cfg ProcConfig) *Proc {
	tb.Helper()
	path := cfg.Path
	if path == "" {
		path = Binary(tb)
	}
	name := cfg.Name
	if name == "" {
		name = filepath.Base(path)
	}
	argv := append(append(append([]string(nil), cfg.Wrap...), path), cfg.Args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	if len(cfg.Env) > 0 {
		cmd.Env = append(os.Environ(), cfg.Env...)
	}
	p := &Proc{name: name, cmd: cmd, out: &Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", name, err)
	}
	go func() { // ends when the process has exited: Kill at cleanup sees to it
		_ = cmd.Wait()
		close(p.done)
	}()
	// A Go process (rlhub) still running when its test failed is asked
	// for its goroutines first: the output then says where it was stuck.
	goProc := cfg.Path == "" || filepath.Base(path) == "rlhub"
	tb.Cleanup(func() {
		if tb.Failed() && goProc {
			p.Stop(syscall.SIGQUIT, 5*time.Second)
		}
		p.Kill()
		if tb.Failed() {
			out := p.out.String()
			if len(out) > outputTail {
				out = "…" + out[len(out)-outputTail:]
			}
			tb.Logf("%s (pid %d) %s; output:\n%s", name, cmd.Process.Pid, cmd.ProcessState, out)
		}
	})
	if cfg.AddrFile != "" {
		p.addr = p.waitAddrFile(tb, cfg.AddrFile, cfg.StartTimeout)
	}
	return p
}

// waitAddrFile reads the file first, then checks for an exit: a process
// may publish its address and end at once (a hub told to crash at its
// first report), and the address still counts.
func (p *Proc) waitAddrFile(tb testing.TB, path string, timeout time.Duration) string {
	tb.Helper()
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	var addr string
	Eventually(tb, timeout, p.name+" to write its address to "+path, func() bool {
		if b, err := os.ReadFile(path); err == nil && strings.HasSuffix(string(b), "\n") {
			addr = strings.TrimSpace(string(b))
			return true
		}
		select {
		case <-p.done:
			tb.Fatalf("%s exited (%v) before writing its address:\n%s", p.name, p.cmd.ProcessState, p.out)
		default:
		}
		return false
	})
	return addr
}

// Name is the process's label.
func (p *Proc) Name() string { return p.name }

// Addr is the address read from ProcConfig.AddrFile ("" without one).
func (p *Proc) Addr() string { return p.addr }

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Out is the process's combined stdout and stderr, still being written
// while it runs.
func (p *Proc) Out() *Buffer { return p.out }

// Output is what the process has written so far.
func (p *Proc) Output() string { return p.out.String() }

// Done is closed once the process has exited and its output is read.
func (p *Proc) Done() <-chan struct{} { return p.done }

// State is how the process ended, or nil while it runs.
func (p *Proc) State() *os.ProcessState {
	select {
	case <-p.done:
		return p.cmd.ProcessState
	default:
		return nil
	}
}

// KilledBy is the signal that ended the process, or false if it runs or
// exited by itself.
func (p *Proc) KilledBy() (syscall.Signal, bool) {
	st := p.State()
	if st == nil {
		return 0, false
	}
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return 0, false
	}
	return ws.Signal(), true
}

// Signal sends sig (SIGSTOP, SIGCONT, SIGINT …) to the process, failing
// tb if it cannot be delivered.
func (p *Proc) Signal(tb testing.TB, sig os.Signal) {
	tb.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		tb.Fatalf("signal %v to %s: %v", sig, p.name, err)
	}
}

// Kill SIGKILLs the process (SIGCONT first, so a stopped process dies
// too) and returns once it is reaped. It does nothing to a process that
// has ended, and is safe to call more than once.
func (p *Proc) Kill() { p.Stop(syscall.SIGKILL, 0) }

// Stop sends sig and waits up to grace for the process to end, then
// SIGKILLs it; it returns once the process is reaped.
func (p *Proc) Stop(sig os.Signal, grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	if sig != syscall.SIGKILL {
		_ = p.cmd.Process.Signal(sig)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-p.done:
			return
		case <-t.C:
		}
	}
	_ = p.cmd.Process.Kill() // only fails once the process is reaped
	<-p.done
}

// Wait waits up to timeout for the process to end by itself and returns
// how it ended; if it has not, tb fails with its output.
func (p *Proc) Wait(tb testing.TB, timeout time.Duration) *os.ProcessState {
	tb.Helper()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.cmd.ProcessState
	case <-t.C:
		tb.Fatalf("%s did not end within %v:\n%s", p.name, timeout, p.out)
	}
	return nil
}
