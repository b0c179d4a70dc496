package relay

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/wire/bodylimit"
	"github.com/rlhub/rlhub/internal/wsync"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// A local collector that attaches and stops reading held the relay's
// version for as long as it liked (gRPC flow control blocks the send and
// keepalive keeps the connection). The relay cuts its stream once the
// version is not taken within Config.BodyTimeout + its length at
// BodyMinRate (UNAVAILABLE naming the limit) and counts it; a collector
// that reads is served the same version whole.
func TestRelayCutsAStalledCollector(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := startHub(t)
	relay := runRelay(t, Config{Upstream: dial(t, h.addr), Model: "m", ID: "relay-stalled",
		BodyTimeout: 2 * time.Second, BodyMinRate: 8 << 20, Logger: quiet()})
	const words = 10 << 20 // 40 MiB: more than flow control lets through unread; due in 7 s
	h.push(t, 1, words)
	waitFor(t, "the relay at v1", func() bool { return relay.Newest() == 1 })

	stalled, err := rlhubv1.NewWeightSyncClient(dial(t, relay.Addr())).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stalled.Send(&rlhubv1.SyncClientMessage{Body: &rlhubv1.SyncClientMessage_Hello{Hello: &rlhubv1.SyncHello{
		CollectorId: "stalled", Model: "m"}}}); err != nil {
		t.Fatal(err)
	}
	info, err := stalled.Recv()
	if err != nil || info.GetInfo().GetVersion() != 1 {
		t.Fatalf("the stalled collector's first message: %v, %v", info, err)
	}
	total := info.GetInfo().GetTotalBytes()
	waitFor(t, "the stalled collector cut", func() bool { return relay.BodyStats() == bodylimit.Stats{Sent: 1} })
	var got uint64
	for {
		m, err := stalled.Recv()
		if err != nil {
			if st, _ := status.FromError(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "body-timeout") {
				t.Fatalf("the stalled stream ended with %v, want UNAVAILABLE naming the body timeout", err)
			}
			break
		}
		got += uint64(len(m.GetChunk().GetData()))
	}
	if got >= total {
		t.Fatalf("the stalled collector got the whole version (%d bytes) before its cut", got)
	}

	cl, err := wsync.Attach(ctx, wsync.ClientConfig{Conn: dial(t, relay.Addr()), CollectorID: "reads", Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	snap, err := cl.WaitNewer(ctx, 0)
	if err != nil || snap.Version != 1 || !bytes.Equal(snap.Blob, wsynctest.Snap(t, "m", 1, words).Blob) {
		t.Fatalf("a collector that reads got %v, %v; want v1 whole", snap, err)
	}
	if st := relay.BodyStats(); st != (bodylimit.Stats{Sent: 1}) {
		t.Fatalf("stats %+v after a collector that reads", st)
	}
}

// A relay listening off loopback is as exposed as a hub: one peer IP holds
// at most Config.MaxStreamsPerPeer streams on it; one past the cap fails
// RESOURCE_EXHAUSTED naming the flag, and a closed stream frees its place.
func TestRelayCapsStreamsPerPeer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := startHub(t)
	relay := runRelay(t, Config{Upstream: dial(t, h.addr), Model: "m", ID: "relay-capped", MaxStreamsPerPeer: 2, Logger: quiet()})
	h.push(t, 1, 1000)
	waitFor(t, "the relay at v1", func() bool { return relay.Newest() == 1 })
	sc := rlhubv1.NewWeightSyncClient(dial(t, relay.Addr()))
	// attach opens a stream and returns its first message's error.
	attach := func(id string) (context.CancelFunc, error) {
		sctx, scancel := context.WithCancel(ctx)
		s, err := sc.Attach(sctx)
		if err != nil {
			t.Fatal(err)
		}
		// A Send the server ended says io.EOF: its status comes with Recv.
		_ = s.Send(&rlhubv1.SyncClientMessage{Body: &rlhubv1.SyncClientMessage_Hello{Hello: &rlhubv1.SyncHello{
			CollectorId: id, Model: "m"}}})
		_, err = s.Recv()
		return scancel, err
	}
	first, err := attach("c1")
	if err != nil {
		t.Fatal(err)
	}
	second, err := attach("c2")
	if err != nil {
		t.Fatal(err)
	}
	defer second()
	third, err := attach("c3")
	third()
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "--max-streams-per-peer") {
		t.Fatalf("a third stream from one peer: %v, want RESOURCE_EXHAUSTED naming --max-streams-per-peer", err)
	}
	first()
	waitFor(t, "a closed stream's place freed", func() bool {
		stop, err := attach("c4")
		defer stop()
		return err == nil
	})
}
