package testkit

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childEnv makes this test binary a child process for the Proc tests
// (TestMain): `publish FILE` writes an address to FILE and runs until
// SIGINT (then exits 0); `early` exits 3 at once.
const childEnv = "RLHUB_TESTKIT_CHILD"

func childMain(args []string) int {
	switch args[0] {
	case "publish":
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt)
		fmt.Println("child up")
		if err := os.WriteFile(args[1], []byte("127.0.0.1:1\n"), 0o644); err != nil {
			return 1
		}
		<-sig
		fmt.Println("child interrupted")
		return 0
	case "early":
		fmt.Println("dying early")
		return 3
	case "ask":
		// Dials args[1] (from the namespace it was started in) and prints
		// what the "hostname" child there says within args[2], or the
		// error.
		timeout, err := time.ParseDuration(args[2])
		if err != nil {
			fmt.Println("error:", err)
			return 2
		}
		got, err := hello(args[1], timeout)
		if err != nil {
			fmt.Println("error:", err)
			return 0
		}
		fmt.Println(got)
		return 0
	case "hostname":
		// Listens on every address; publishes "HOSTNAME:PORT" and says
		// its hostname to each connection until killed.
		lis, err := net.Listen("tcp", ":0")
		if err != nil {
			return 1
		}
		host, _ := os.Hostname()
		port := lis.Addr().(*net.TCPAddr).Port
		if err := os.WriteFile(args[1], []byte(fmt.Sprintf("%s:%d\n", host, port)), 0o644); err != nil {
			return 1
		}
		for {
			c, err := lis.Accept()
			if err != nil {
				return 1
			}
			fmt.Fprintln(c, host)
			c.Close()
		}
	}
	return 2
}

func startChild(tb testing.TB, args ...string) (*Proc, string) {
	addrFile := filepath.Join(tb.TempDir(), "addr")
	p := StartProc(tb, ProcConfig{Name: "child", Path: os.Args[0], Args: append(args, addrFile),
		Env: []string{childEnv + "=1"}, AddrFile: addrFile, StartTimeout: 30 * time.Second})
	return p, addrFile
}

func TestProcPublishesAddressAndDiesOfSIGKILL(t *testing.T) {
	p, _ := startChild(t, "publish")
	if p.Addr() != "127.0.0.1:1" {
		t.Fatalf("Addr = %q", p.Addr())
	}
	if p.State() != nil {
		t.Fatal("State of a running process is not nil")
	}
	// A stopped process still dies of Kill (it is continued first).
	p.Signal(t, syscall.SIGSTOP)
	p.Kill()
	if sig, ok := p.KilledBy(); !ok || sig != syscall.SIGKILL {
		t.Fatalf("KilledBy = %v, %v; want SIGKILL", sig, ok)
	}
	if !strings.Contains(p.Output(), "child up") {
		t.Fatalf("output %q", p.Output())
	}
	p.Kill() // again: a no-op
}

func TestProcStopWithGrace(t *testing.T) {
	p, _ := startChild(t, "publish")
	p.Stop(os.Interrupt, 30*time.Second)
	if st := p.State(); st == nil || st.ExitCode() != 0 {
		t.Fatalf("after SIGINT: %v", st)
	}
	if _, ok := p.KilledBy(); ok {
		t.Fatal("a process that exited by itself reports a killing signal")
	}
	if !strings.Contains(p.Output(), "child interrupted") {
		t.Fatalf("output %q", p.Output())
	}
}

// fakeTB records a failure, the cleanups and the logs, so the helpers'
// own failures and cleanups can be checked.
type fakeTB struct {
	*recorder
	cleanups []func()
	logs     strings.Builder
}

func (f *fakeTB) Cleanup(fn func())               { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Failed() bool                    { return f.failed }
func (f *fakeTB) Logf(format string, args ...any) { fmt.Fprintf(&f.logs, format+"\n", args...) }
func (f *fakeTB) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

// A process that exits before it writes its address fails the test with
// its output, and is reaped.
func TestProcExitBeforeAddressFails(t *testing.T) {
	f := &fakeTB{recorder: &recorder{TB: t}}
	catch(f.recorder, func() { startChild(f, "early") })
	f.runCleanups()
	if !f.failed || !strings.Contains(f.msg, "exited") || !strings.Contains(f.msg, "dying early") {
		t.Fatalf("failed=%v msg=%q", f.failed, f.msg)
	}
	if !strings.Contains(f.logs.String(), "dying early") {
		t.Fatalf("a failed test's cleanup did not log the output: %q", f.logs.String())
	}
}

// At cleanup a running process is SIGKILLed and reaped; a test that
// passed logs nothing.
func TestProcReapedAtCleanup(t *testing.T) {
	f := &fakeTB{recorder: &recorder{TB: t}}
	var p *Proc
	catch(f.recorder, func() { p, _ = startChild(f, "publish") })
	if f.failed {
		t.Fatal(f.msg)
	}
	f.runCleanups()
	select {
	case <-p.Done():
	default:
		t.Fatal("the process outlived its test's cleanup")
	}
	if sig, ok := p.KilledBy(); !ok || sig != syscall.SIGKILL {
		t.Fatalf("KilledBy = %v, %v", sig, ok)
	}
	if f.logs.Len() != 0 {
		t.Fatalf("a passing test logged %q", f.logs.String())
	}
}

func TestBinaryHonoursRLHUB_BIN(t *testing.T) {
	t.Setenv("RLHUB_BIN", "/some/rlhub")
	if got := Binary(t); got != "/some/rlhub" {
		t.Fatalf("Binary = %q", got)
	}
}
