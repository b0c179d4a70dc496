package hub

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// A client id names every gradient in the reducer's exactly-once ledger
// (kept per client), its journal (written per batch) and a secondary's
// memory of refused pushes, so a push with one over 128 bytes is refused,
// InvalidArgument, on both transports, counted dropped as invalid, and
// lands nowhere. Before, 100 pushes of a 4 KiB gradient with 500 KB client
// ids grew a real hub's journal by 46 MB (and its ledger by as much, for
// good).
func TestClientIDIsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	model, _ := tensor.NewStateDict(tensor.NewF32("w", 1024))
	h, good := startWithSGDModel(t, ctx, Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), Reducer: reducer.Config{BatchSize: 1}}, model)
	for _, transport := range []string{reducer.TransportAuto, reducer.TransportGRPC} {
		c, err := reducer.NewClient(reducer.ClientConfig{Hub: h.Addr().String(), Transport: transport,
			ClientID: strings.Repeat("C", 500_000), MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.PushGrad(ctx, "m", 1, model)
		c.Close()
		if !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "client id") || len(err.Error()) > 512 {
			t.Fatalf("%q transport: push with a 500 KB client id: %.200v; want InvalidArgument, short, naming the client id", transport, err)
		}
	}
	st := h.Reducer().Stats()
	if st.Total.Dropped[reduce.ReasonInvalid] != 2 || st.Total.Applied != 0 {
		t.Fatalf("counters %+v: want the 2 refused pushes dropped as invalid, none applied", st.Total)
	}
	if _, err := good.PushGrad(ctx, "m", 1, model); err != nil {
		t.Fatalf("a push with a short client id: %v", err)
	}
}

// A secondary's Attach is kept for the session and listed to every client
// by Secondaries, so an id over 128 bytes or an address over 512 is
// refused, InvalidArgument, and nothing is listed. Before, an Attach
// stream could hold a 4 MB address, sent to every client that asked.
func TestSecondaryAttachIsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	model, _ := tensor.NewStateDict(tensor.NewF32("w", 4))
	h, c := startWithSGDModel(t, ctx, Config{Listen: "127.0.0.1:0", Logger: testkit.Logger()}, model)
	before, err := c.Secondaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(h.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, req := range []*rlhubv1.ReducerAttachRequest{
		{Id: "s", Addr: strings.Repeat("a", 3<<20)},
		{Id: strings.Repeat("i", reducer.MaxSecondaryIDBytes+1), Addr: "127.0.0.1:1"},
	} {
		stream, err := rlhubv1.NewReducerPrimaryClient(conn).Attach(ctx, req)
		if err == nil {
			_, err = stream.Recv()
		}
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || len(st.Message()) > 512 {
			t.Fatalf("attach with a %d-byte id and a %d-byte address: %v %.200q, want InvalidArgument, short", len(req.Id), len(req.Addr), st.Code(), st.Message())
		}
	}
	after, err := c.Secondaries(ctx)
	if err != nil || len(after) != len(before) {
		t.Fatalf("secondaries after the refused attaches: %v, %v; want the %d from before", after, err, len(before))
	}
}
