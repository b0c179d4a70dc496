package hub

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// rawBulkRequest opens a data-plane connection to addr, sends one request
// frame and returns the kind of the server's next frame and, for a final
// frame, its status. It speaks the protocol by hand (docs/wire.md) so that
// nothing but the request frame is ever sent: a "continue" answer would
// mean the server asked for the body.
func rawBulkRequest(t *testing.T, addr, method string, header []byte) (kind byte, st *spb.Status) {
	t.Helper()
	return rawBulkRequestAs(t, addr, "", method, header)
}

// sendBulkRequest sends the data-plane handshake (with token) and a
// request frame for method with header on c, and reads the server's
// handshake: the returned reader reads the frames that follow.
func sendBulkRequest(t *testing.T, c net.Conn, token, method string, header []byte) *bufio.Reader {
	t.Helper()
	frame := bulk.Hello(token)
	frame = append(frame, 1)
	frame = binary.LittleEndian.AppendUint16(frame, uint16(len(method)))
	frame = append(frame, method...)
	frame = binary.LittleEndian.AppendUint32(frame, uint32(len(header)))
	frame = append(frame, header...)
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	magic := make([]byte, len(bulk.Magic))
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != bulk.Magic {
		t.Fatalf("data-plane handshake: %q, %v", magic, err)
	}
	return br
}

// rawBulkRequestAs is rawBulkRequest with token in the handshake.
func rawBulkRequestAs(t *testing.T, addr, token, method string, header []byte) (kind byte, st *spb.Status) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second)) // a hang guard, not a measurement
	br := sendBulkRequest(t, c, token, method, header)
	kind, err = br.ReadByte()
	if err != nil {
		t.Fatalf("no answer to the request: %v", err)
	}
	if kind != 3 {
		return kind, nil
	}
	var n [4]byte
	if _, err := io.ReadFull(br, n[:]); err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, binary.LittleEndian.Uint32(n[:]))
	if _, err := io.ReadFull(br, raw); err != nil {
		t.Fatal(err)
	}
	st = &spb.Status{}
	if err := proto.Unmarshal(raw, st); err != nil {
		t.Fatal(err)
	}
	return kind, st
}

// TestOversizeGradientRefusedFromHeader is issue 16's third abuse: a
// gradient body is capped by its model's size, decided from the header
// before any body byte is read. A push that claims 256 MiB for a 4 KiB model
// gets a final InvalidArgument answer to its request frame, never a
// "continue": the server read the request frame and nothing more.
func TestOversizeGradientRefusedFromHeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	model, _ := tensor.NewStateDict(tensor.NewF32("w", 1024)) // 4 KiB
	h, c := startWithSGDModel(t, ctx, Config{Listen: "127.0.0.1:0", Logger: testkit.Logger(), Reducer: reducer.Config{BatchSize: 1}}, model)
	blob, _ := safetensors.Encode(model, nil)
	for _, tc := range []struct {
		name  string
		bytes uint64
		want  byte
	}{
		{"256 MiB for a 4 KiB model", 256 << 20, 3},
		{"one byte over the cap", uint64(len(blob)) + reducer.GradHeaderSlack(model) + 1, 3},
		{"a gradient of the model's own size", uint64(len(blob)), 2},
	} {
		hdr, _ := proto.Marshal(&rlhubv1.ReducerPushHeader{ClientId: "hostile", Seq: 1,
			Blob: &rlhubv1.BlobInfo{Model: "m", Version: 1, TotalBytes: tc.bytes}})
		kind, st := rawBulkRequest(t, h.Addr().String(), reducer.BulkPushMethod, hdr)
		if kind != tc.want {
			t.Fatalf("%s: the server answered frame kind %d (status %v), want %d (2 = asked for the body, 3 = refused)", tc.name, kind, st, tc.want)
		}
		if tc.want == 3 && codes.Code(st.GetCode()) != codes.InvalidArgument {
			t.Fatalf("%s: status %v, want InvalidArgument", tc.name, st)
		}
	}
	// The refused pushes cost nothing: a real gradient still goes through.
	if _, err := c.PushGrad(ctx, "m", 0, model); err != nil {
		t.Fatal(err)
	}
}

// TestErrorTextBoundsClientInput is issue 16's last abuse: a 10 KB learner
// id used to come back whole in the error (and trip gRPC's header limit).
// Every service refuses such input with a short error naming what is
// wrong: the learner aggregator's Attach, the store's Pull, and ARS.
func TestErrorTextBoundsClientInput(t *testing.T) {
	h, err := New(Config{Listen: "127.0.0.1:0", Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(h.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	huge := strings.Repeat("x", 10<<10)
	check := func(what string, err error, want codes.Code) {
		t.Helper()
		st, _ := status.FromError(err)
		if st.Code() != want || len(st.Message()) > 512 || !strings.Contains(st.Message(), "10240 bytes") {
			t.Fatalf("%s with a 10 KB id: code %v, message of %d bytes %.200q; want %v, short, saying how long the id was",
				what, st.Code(), len(st.Message()), st.Message(), want)
		}
	}

	stream, err := rlhubv1.NewLearnerAggregatorClient(conn).Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&rlhubv1.LearnerMessage{Body: &rlhubv1.LearnerMessage_Hello{Hello: &rlhubv1.Hello{LearnerId: huge}}}); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	check("Attach", err, codes.InvalidArgument)

	pull, err := rlhubv1.NewModelStoreClient(conn).Pull(ctx, &rlhubv1.StorePullRequest{Model: huge})
	if err == nil {
		_, err = pull.Recv()
	}
	check("store Pull", err, codes.NotFound)

	_, err = rlhubv1.NewARSClient(conn).StopRun(ctx, &rlhubv1.ARSStopRunRequest{RunId: huge})
	check("ARS StopRun", err, codes.NotFound)
}
