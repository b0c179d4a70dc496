// Package testkit is what every package's tests share: a real gRPC server
// on 127.0.0.1:0, a logger that discards, bounded waits that fail with a
// message instead of hanging or sleeping, and real processes (the rlhub
// binary, built once per test binary, or the test binary re-executed)
// started, signalled and SIGKILLed (proc.go).
//
// Each helper ties what it starts to tb.Cleanup, so a test never leaks a
// goroutine, a port or a process (goleak stays green in the packages that
// check).
package testkit

import (
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// Logger discards everything: for components whose logs are not under test.
func Logger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Listen opens a TCP listener on 127.0.0.1:0, closed at cleanup.
func Listen(tb testing.TB) net.Listener {
	tb.Helper()
	return ListenAt(tb, "127.0.0.1:0")
}

// ListenAt opens a TCP listener on addr, closed at cleanup: a server
// restarted at the address its clients know (addr from an earlier Listen).
func ListenAt(tb testing.TB, addr string) net.Listener {
	tb.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { lis.Close() })
	return lis
}

// stopGrace bounds a graceful stop at cleanup; after it the server stops
// hard, so a test with a stream left open still ends.
const stopGrace = 5 * time.Second

// ServeGRPC starts a gRPC server with opts on lis (a fresh 127.0.0.1:0
// listener when lis is nil), lets register add services to it, and
// returns its address. At cleanup it stops gracefully, then hard after a
// bounded grace, and waits for Serve to return.
func ServeGRPC(tb testing.TB, lis net.Listener, register func(*grpc.Server), opts ...grpc.ServerOption) string {
	tb.Helper()
	if lis == nil {
		lis = Listen(tb)
	}
	srv := grpc.NewServer(opts...)
	register(srv)
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(lis) })
	tb.Cleanup(func() {
		StopGRPC(srv, stopGrace)
		wg.Wait()
	})
	return lis.Addr().String()
}

// StopGRPC stops srv gracefully, and hard once grace has passed.
func StopGRPC(srv *grpc.Server, grace time.Duration) {
	done := make(chan struct{})
	go func() { defer close(done); srv.GracefulStop() }()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		srv.Stop()
		<-done
	}
}

// Eventually polls cond, with a backoff from 1 ms to 50 ms, until it
// returns true; if timeout passes first it fails tb with "timed out after
// …: waiting for " + what. It never asserts how quickly cond came true.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v: waiting for %s", timeout, what)
		}
		time.Sleep(wait)
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// Recv receives one value from ch, failing tb if timeout passes first or
// ch is closed.
func Recv[T any](tb testing.TB, ch <-chan T, timeout time.Duration, what string) T {
	tb.Helper()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case v, ok := <-ch:
		if !ok {
			tb.Fatalf("%s: channel closed", what)
		}
		return v
	case <-t.C:
		tb.Fatalf("timed out after %v: waiting for %s", timeout, what)
	}
	panic("unreachable")
}
