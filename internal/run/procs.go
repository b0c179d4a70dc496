package run

import (
	"context"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// selfCPU returns this process's CPU time so far (user + system).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// workerProcs owns the worker processes a run starts: one goroutine per
// process waits for it. stop interrupts them (SIGINT, then a kill after
// WaitDelay) and returns only when every goroutine has ended.
type workerProcs struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{} // closed when the last started process exits

	mu     sync.Mutex
	alive  int           // processes started and not yet exited; guarded by mu
	sealed bool          // no more processes will start; guarded by mu
	closed bool          // done is closed; guarded by mu
	cpu    time.Duration // user + system time of exited processes; guarded by mu
}

// closeIfAllExitedLocked closes done once starting is over and nothing is
// alive. Caller holds mu.
func (w *workerProcs) closeIfAllExitedLocked() {
	if w.sealed && w.alive == 0 && !w.closed {
		w.closed = true
		close(w.done)
	}
}

// seal says every process has been started: from now on allExited can fire.
func (w *workerProcs) seal() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sealed = true
	w.closeIfAllExitedLocked()
}

func newWorkerProcs() *workerProcs {
	ctx, cancel := context.WithCancel(context.Background())
	return &workerProcs{ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

func (w *workerProcs) start(exe string, args []string, out io.Writer) error {
	p := exec.CommandContext(w.ctx, exe, args...)
	p.Stdout, p.Stderr = out, out
	p.Cancel = func() error { return p.Process.Signal(os.Interrupt) }
	p.WaitDelay = 5 * time.Second
	if err := p.Start(); err != nil {
		return err
	}
	w.mu.Lock()
	w.alive++
	w.mu.Unlock()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		p.Wait()
		w.mu.Lock()
		defer w.mu.Unlock()
		if p.ProcessState != nil {
			w.cpu += p.ProcessState.UserTime() + p.ProcessState.SystemTime()
		}
		w.alive--
		w.closeIfAllExitedLocked()
	}()
	return nil
}

// allExitedIf is closed once seal was called and every started process
// has exited, when cond holds; otherwise it is a channel that never fires.
func (w *workerProcs) allExitedIf(cond bool) <-chan struct{} {
	if cond {
		return w.done
	}
	return nil
}

// stop ends every process and returns their total CPU time. Safe to call
// twice.
func (w *workerProcs) stop() time.Duration {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cpu
}
