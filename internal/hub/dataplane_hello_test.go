package hub

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// helloAnswer sends the data-plane hello with token on a new connection to
// addr and returns the server's answer to it: the magic (st nil), or the
// final status the server sent in its place; closed reports whether the
// server then ended the connection.
func helloAnswer(t *testing.T, addr, token string) (st *spb.Status, closed bool) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second)) // a hang guard, not a measurement
	if _, err := c.Write(bulk.Hello(token)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	first, err := br.ReadByte()
	if err != nil {
		t.Fatalf("no answer to the hello: %v", err)
	}
	if first == bulk.Magic[0] {
		rest := make([]byte, len(bulk.Magic)-1)
		if _, err := io.ReadFull(br, rest); err != nil || string(first)+string(rest) != bulk.Magic {
			t.Fatalf("answer to the hello: %q, %v", string(first)+string(rest), err)
		}
		return nil, false
	}
	if first != bulk.KindFinal {
		t.Fatalf("answer to the hello begins with %d, want the magic or a final status (3)", first)
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
	_, err = br.ReadByte()
	return st, errors.Is(err, io.EOF)
}

// A data-plane connection without a token, or with one the hub does not
// know, is refused at its hello: the hub answers Unauthenticated in place
// of the magic and closes it, having read nothing but the hello. Before,
// it answered the magic and then read request after request from such a
// connection — each a header of up to 1 MiB, held until the guard refused
// it — and kept it idle for the idle timeout (2 min); only the per-peer
// cap of 256 connections bounded what one peer held. The Go client
// returns the refusal as a request's (errs.ErrUnauthenticated), and keeps
// using the data plane for the address: it speaks it.
func TestDataPlaneHelloWithoutAValidTokenIsRefused(t *testing.T) {
	tok, hash, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	v := auth.NewVerifier(map[string]auth.Principal{hash: {Name: "reader", Role: auth.Reader, Scopes: []string{""}}})
	h, err := New(Config{Listen: "127.0.0.1:0", Auth: v, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	addr := h.Addr().String()

	for _, tc := range []struct{ name, token string }{{"no token", ""}, {"unknown token", "rlh_nobody"}} {
		st, closed := helloAnswer(t, addr, tc.token)
		if st == nil || codes.Code(st.GetCode()) != codes.Unauthenticated || !closed {
			t.Fatalf("hello with %s: status %v, closed %v; want Unauthenticated in place of the magic, then the end", tc.name, st, closed)
		}
	}
	if st, _ := helloAnswer(t, addr, tok); st != nil {
		t.Fatalf("hello with a known token: %v, want the magic", st)
	}
	testkit.Eventually(t, 10*time.Second, "the refusals counted", func() bool {
		return h.bulk.Stats().Refused[bulk.RefusedUnauthenticated] == 2
	})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pull := &rlhubv1.StorePullRequest{Model: "m"}
	anon := bulk.NewClient()
	defer anon.Close()
	err = anon.CallRecv(ctx, addr, storerpc.BulkPullMethod, pull, nil, func([]byte, int64, io.Reader) error { return nil }, nil)
	if !errors.Is(err, errs.ErrUnauthenticated) || !anon.Supported(addr) {
		t.Fatalf("a pull without a token: %v (data plane still used: %v), want Unauthenticated", err, anon.Supported(addr))
	}
	reader := bulk.NewClientConfig(bulk.ClientConfig{Token: tok})
	defer reader.Close()
	err = reader.CallRecv(ctx, addr, storerpc.BulkPullMethod, pull, nil, func([]byte, int64, io.Reader) error { return nil }, nil)
	if !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("a pull of a missing model with a reader's token: %v, want NotFound", err)
	}
}

// A data-plane connection whose token was revoked after its hello is
// closed once a request on it is refused Unauthenticated: its token is the
// connection's, so every later request would be refused too. Before, the
// connection stayed open, and a peer could go on sending request headers
// of up to 1 MiB each, every one read and held before the guard refused
// it, as a connection without a token could before the hello was judged.
func TestDataPlaneConnectionIsClosedOnceItsTokenIsRefused(t *testing.T) {
	tok, hash, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	p := auth.Principal{Name: "reader", Role: auth.Reader, Scopes: []string{""}}
	v := auth.NewVerifier(map[string]auth.Principal{hash: p})
	h, err := New(Config{Listen: "127.0.0.1:0", Auth: v, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	c, err := net.DialTimeout("tcp", h.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second)) // a hang guard, not a measurement
	hdr, _ := proto.Marshal(&rlhubv1.StorePullRequest{Model: "m"})
	br := sendBulkRequest(t, c, tok, storerpc.BulkPullMethod, hdr)
	if st := readFinal(t, br); codes.Code(st.GetCode()) != codes.NotFound {
		t.Fatalf("a pull with the token: %v, want NotFound", st)
	}
	v.Replace(map[string]auth.Principal{}) // the token is revoked
	if _, err := c.Write(requestFrame(storerpc.BulkPullMethod, hdr)); err != nil {
		t.Fatal(err)
	}
	if st := readFinal(t, br); codes.Code(st.GetCode()) != codes.Unauthenticated {
		t.Fatalf("a pull after the token was revoked: %v, want Unauthenticated", st)
	}
	if b, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the refusal the connection gave %d, %v; want its end", b, err)
	}
}

// requestFrame is a data-plane request frame (docs/wire.md).
func requestFrame(method string, header []byte) []byte {
	frame := []byte{1}
	frame = binary.LittleEndian.AppendUint16(frame, uint16(len(method)))
	frame = append(frame, method...)
	frame = binary.LittleEndian.AppendUint32(frame, uint32(len(header)))
	return append(frame, header...)
}

// readFinal reads a final frame (kind 3) from br.
func readFinal(t *testing.T, br *bufio.Reader) *spb.Status {
	t.Helper()
	kind, err := br.ReadByte()
	if err != nil || kind != 3 {
		t.Fatalf("answer: frame kind %d, %v; want a final status (3)", kind, err)
	}
	var n [4]byte
	if _, err := io.ReadFull(br, n[:]); err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, binary.LittleEndian.Uint32(n[:]))
	if _, err := io.ReadFull(br, raw); err != nil {
		t.Fatal(err)
	}
	st := &spb.Status{}
	if err := proto.Unmarshal(raw, st); err != nil {
		t.Fatal(err)
	}
	return st
}
