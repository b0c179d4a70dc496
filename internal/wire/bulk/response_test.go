package bulk_test

import (
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/wire/bulk"
)

// A server answering a call OK with a response of another type (its type
// URL 3 MiB long) fails the call with an error that quotes the type
// bounded, not the whole URL.
func TestAnOKAnswerOfAnotherTypeIsQuotedBounded(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := lis.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		hello := make([]byte, len(bulk.Hello("")))
		if _, err := io.ReadFull(c, hello); err != nil {
			return
		}
		if _, err := c.Write([]byte(bulk.Magic)); err != nil {
			return
		}
		var head [3]byte // kind, method length
		if _, err := io.ReadFull(c, head[:]); err != nil {
			return
		}
		rest := make([]byte, int(binary.LittleEndian.Uint16(head[1:]))+4)
		if _, err := io.ReadFull(c, rest); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(binary.LittleEndian.Uint32(rest[len(rest)-4:]))); err != nil {
			return
		}
		st := &spb.Status{Details: []*anypb.Any{{TypeUrl: "type.googleapis.com/" + strings.Repeat("x", 3<<20)}}}
		raw, _ := proto.Marshal(st)
		frame := binary.LittleEndian.AppendUint32([]byte{3}, uint32(len(raw)))
		if _, err := c.Write(append(frame, raw...)); err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, c) // until the client hangs up
	}()
	c := bulk.NewClient()
	var resp wrapperspb.UInt64Value
	err = c.Call(ctx(t), lis.Addr().String(), "sum", wrapperspb.UInt64(0), nil, &resp)
	c.Close()
	<-served
	if err == nil || !strings.Contains(err.Error(), "type.googleapis.com/xxx") {
		t.Fatalf("err %v, want one naming the type answered", err)
	}
	if n := len(err.Error()); n > 1000 {
		t.Fatalf("the error is %d bytes long", n)
	}
}
