package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	gstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/testkit"
)

// refusingHealth answers every Check with the refusal it holds.
type refusingHealth struct {
	healthpb.UnimplementedHealthServer
	r *Refusal
}

func (h refusingHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return nil, grpcerr.ToStatus(Refuse(ctx, h.r))
}

func TestRefusalMessageIsTheContract(t *testing.T) {
	known := NewRefusal(&Leader{ID: "a", Addr: "10.0.0.1:7470", Epoch: 42})
	if got, want := known.Error(), "rlhub: this hub is a standby; the primary is 10.0.0.1:7470 (epoch 42)"; got != want {
		t.Fatalf("message %q, want %q", got, want)
	}
	if got, want := NewRefusal(nil).Error(), "rlhub: this hub is a standby; the primary is unknown"; got != want {
		t.Fatalf("message %q, want %q", got, want)
	}
	if !errors.Is(known, errs.ErrUnavailable) {
		t.Fatal("a refusal does not match errs.ErrUnavailable")
	}
	long := NewRefusal(&Leader{Addr: strings.Repeat("x", 10_000), Epoch: 1})
	if long.Known() || len(long.Error()) > 100 {
		t.Fatalf("an oversized address travelled: %d bytes", len(long.Error()))
	}
}

// Over real gRPC: the code, the message, the trailers and the detail all
// arrive, and AsRefusal finds the primary from each alone.
func TestRefusalOverGRPC(t *testing.T) {
	want := &Refusal{Primary: "127.0.0.1:7471", Epoch: 9}
	addr := testkit.ServeGRPC(t, testkit.Listen(t), func(s *grpc.Server) {
		healthpb.RegisterHealthServer(s, refusingHealth{r: want})
	})
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var tr metadata.MD
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&tr))
	if gstatus.Code(err) != codes.Unavailable {
		t.Fatalf("code %v, want Unavailable: %v", gstatus.Code(err), err)
	}
	if got := gstatus.Convert(err).Message(); got != want.Error() {
		t.Fatalf("message %q, want %q", got, want.Error())
	}
	if p, e := tr.Get(TrailerPrimary), tr.Get(TrailerEpoch); len(p) != 1 || p[0] != want.Primary || len(e) != 1 || e[0] != "9" {
		t.Fatalf("trailers %v, want %s=%s %s=9", tr, TrailerPrimary, want.Primary, TrailerEpoch)
	}
	for name, in := range map[string]struct {
		err error
		tr  metadata.MD
	}{
		"raw":                    {err, nil},
		"after FromStatus":       {fmt.Errorf("store push: %w", grpcerr.FromStatus(err)), nil},
		"trailer only":           {gstatus.Error(codes.Unavailable, "something else"), tr},
		"message only":           {errors.New("push: " + want.Error()), nil},
		"data-plane final frame": {dataPlaneRoundTrip(t, want), nil},
	} {
		got, ok := AsRefusal(in.err, in.tr)
		if !ok || *got != *want {
			t.Errorf("%s: AsRefusal = %+v, %v; want %+v", name, got, ok, want)
		}
	}
}

// dataPlaneRoundTrip sends a refusal the way the data plane does: the
// status proto marshalled into the final frame, read back on the client.
func dataPlaneRoundTrip(t *testing.T, r *Refusal) error {
	st, _ := gstatus.FromError(grpcerr.ToStatus(r))
	b, err := proto.Marshal(st.Proto())
	if err != nil {
		t.Fatal(err)
	}
	var back spb.Status
	if err := proto.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	return grpcerr.FromStatus(gstatus.ErrorProto(&back))
}

func TestAsRefusalRejectsOtherErrors(t *testing.T) {
	for _, err := range []error{
		nil,
		errors.New("boom"),
		gstatus.Error(codes.Unavailable, "connection refused"), // a hub that is down
		gstatus.Error(codes.PermissionDenied, "rlhub: this hub is a standby; the primary is a:1 (epoch 2)"),
		fmt.Errorf("%w: dial", errs.ErrUnavailable),
	} {
		if r, ok := AsRefusal(err, nil); ok {
			t.Errorf("AsRefusal(%v) = %+v, want not a refusal", err, r)
		}
	}
	unknown, ok := AsRefusal(NewRefusal(nil).GRPCStatus().Err(), nil)
	if !ok || unknown.Known() {
		t.Fatalf("unknown refusal = %+v, %v", unknown, ok)
	}
	// A malformed message still is a refusal, with the primary unknown.
	if r, ok := ParseRefusal("rlhub: this hub is a standby; the primary is a b (epoch x)"); !ok || r.Known() {
		t.Fatalf("malformed = %+v, %v", r, ok)
	}
}
