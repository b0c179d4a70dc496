package wsync

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"

	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Drain is documented to end every Attach stream with UNAVAILABLE "so a
// graceful stop need not wait for them". A collector that is attached but
// has stopped reading (its app is stuck; its transport still answers
// pings) leaves the handler blocked in stream.Send on flow control, where
// the service's context does not reach it: Drain ends nothing, and the
// hub's GracefulStop waits until its hard-stop deadline.
// TestDrainEndsAStreamStalledInSend: a collector that attached and stopped
// reading blocked the handler in Send on flow control; Drain, which cancels
// only the service context, left its stream open, its version borrowed and
// Service.Close waiting. The versions are now sent by a goroutine of the
// stream's own and the handler returns at Drain.
func TestDrainEndsAStreamStalledInSend(t *testing.T) {
	h := startHub(t)
	h.push(t, 1, 1<<20) // 4 MiB: far over the stalled stream's window

	conn := dial(t, h.addr, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stalled, err := rlhubv1.NewWeightSyncClient(conn).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stalled.Send(&rlhubv1.SyncClientMessage{Body: &rlhubv1.SyncClientMessage_Hello{Hello: &rlhubv1.SyncHello{CollectorId: "stalled", Model: "m"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stalled collector attached", func() bool { return h.svc.Stats(ctx).Streams == 1 })
	time.Sleep(500 * time.Millisecond) // the handler is now blocked in Send

	h.svc.Drain()
	deadline := time.Now().Add(5 * time.Second)
	for h.svc.Stats(ctx).Streams != 0 {
		if time.Now().After(deadline) {
			st := h.svc.Stats(ctx)
			t.Fatalf("5s after Drain the stalled collector's stream is still open (Streams=%d, attached=%v): Drain does not end a stream blocked in Send",
				st.Streams, st.Models[0].Collectors[0].Attached)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// And the service's goroutines end: Close returns without the server
	// being stopped first.
	done := make(chan struct{})
	go func() { h.svc.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Service.Close still waiting 5s after Drain")
	}
}

// A stream that never sends its hello leaves the handler blocked in its
// first stream.Recv, which has no deadline and which Drain does not reach:
// the stream stays open after Drain (and for ever before it, uncounted in
// Stats and untracked by MaxCollectors).
// TestDrainEndsAStreamWithoutHello: the hello was read with no deadline
// and Drain did not end the wait.
func TestDrainEndsAStreamWithoutHello(t *testing.T) {
	h := startHub(t)
	conn := dial(t, h.addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	silent, err := rlhubv1.NewWeightSyncClient(conn).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Make sure the stream reached the handler: a header round trip.
	time.Sleep(300 * time.Millisecond)
	if n := h.svc.Stats(ctx).Streams; n != 0 {
		t.Fatalf("Streams = %d before a hello", n)
	}
	h.svc.Drain()
	got := make(chan error, 1)
	go func() { _, err := silent.Recv(); got <- err }()
	select {
	case err := <-got:
		t.Logf("hello-less stream ended after Drain: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("5s after Drain a stream that never sent its hello is still open: its handler waits in Recv with no deadline")
	}
}
