package hub

import (
	"bytes"
	"context"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// rawH2 is a hand-rolled HTTP/2 client on a real TCP connection: it does
// the connection preface, acks the hub's SETTINGS and PINGs (so keepalive
// never closes it), and opens gRPC streams with HEADERS only, never the
// request message.
type rawH2 struct {
	t      *testing.T
	c      net.Conn
	fr     *http2.Framer
	next   uint32
	mu     sync.Mutex  // guards fr's writes
	resets chan uint32 // streams the server ended (RST_STREAM or END_STREAM)
}

// openH2 dials addr and sends HTTP/2's preface and SETTINGS; its frames
// are read by the caller.
func openH2(t *testing.T, addr string) *rawH2 {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	r := &rawH2{t: t, c: c, fr: http2.NewFramer(c, c), next: 1, resets: make(chan uint32, 1<<20)}
	if err := r.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return r
}

func dialRawH2(t *testing.T, addr string) *rawH2 {
	t.Helper()
	r := openH2(t, addr)
	c := r.c
	rd := http2.NewFramer(nil, c)
	go func() {
		for {
			f, err := rd.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					r.mu.Lock()
					_ = r.fr.WriteSettingsAck()
					r.mu.Unlock()
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					r.mu.Lock()
					_ = r.fr.WritePing(true, f.Data)
					r.mu.Unlock()
				}
			case *http2.RSTStreamFrame:
				r.resets <- f.StreamID
			case *http2.HeadersFrame:
				if f.StreamEnded() {
					r.resets <- f.StreamID
				}
			}
		}
	}()
	return r
}

// open starts a call of method: HEADERS without END_STREAM, no DATA.
func (r *rawH2) open(method string, extra ...[2]string) {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, kv := range append([][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "hub"},
		{"content-type", "application/grpc"}, {"te", "trailers"}}, extra...) {
		_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	r.mu.Lock()
	err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: r.next, BlockFragment: hb.Bytes(), EndHeaders: true})
	r.mu.Unlock()
	if err != nil {
		r.t.Fatal(err)
	}
	r.next += 2
}

// TestUnaryCallsWithoutAMessageHoldNothing: a unary call is an HTTP/2
// stream as much as a watch is, and grpc-go runs its handler goroutine
// from its HEADERS on, blocked until the request message comes; the
// stream cap counted streaming methods only, and auth's unary
// interceptor ran only once the message had arrived: one peer without a
// token held 5000 server goroutines with 5000 such calls over one
// connection (--max-streams-per-peer 3). The token is now checked on the
// headers (grpc.InTapHandle).
func TestUnaryCallsWithoutAMessageHoldNothing(t *testing.T) {
	_, hash, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	v := auth.NewVerifier(map[string]auth.Principal{hash: {Name: "trainer", Role: auth.Trainer, Scopes: []string{"*"}}})
	const capStreams = 3
	h, err := New(Config{Listen: "127.0.0.1:0", Auth: v, Logger: testkit.Logger(), Limits: Limits{MaxStreamsPerPeer: capStreams}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	before := runtime.NumGoroutine()
	var ms0 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)

	r := dialRawH2(t, h.Addr().String())
	time.Sleep(200 * time.Millisecond)
	const calls = 5000
	for i := 0; i < calls; i++ {
		r.open("/rlhub.v1.ModelStore/List") // unary; no token sent
	}
	time.Sleep(2 * time.Second)
	after := runtime.NumGoroutine()
	var ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	ended := len(r.resets)
	t.Logf("goroutines %d -> %d (+%d); heap in use %d -> %d KiB; streams ended by the hub: %d; streamcap holds %d for 127.0.0.1",
		before, after, after-before, ms0.HeapInuse>>10, ms1.HeapInuse>>10, ended, h.streams.Held("127.0.0.1"))
	// Held for longer than any of the hub's timeouts would suggest: still
	// there after the handshake (10 s) and frame (10 s) timeouts.
	time.Sleep(12 * time.Second)
	later := runtime.NumGoroutine()
	t.Logf("after 12 s more: goroutines %d (+%d over the start); streams ended by the hub: %d", later, later-before, len(r.resets))
	if later-before > capStreams+50 {
		t.Fatalf("one unauthenticated peer holds %d extra server goroutines with %d unary calls that never sent a message; --max-streams-per-peer is %d",
			later-before, calls, capStreams)
	}
}

// flowH2 is rawH2 with HTTP/2 flow control on the client's sends, to send
// message bytes as fast as the hub's windows let it.
type flowH2 struct {
	*rawH2
	cond    *sync.Cond // on rawH2.mu
	connWin int64
	initWin int64
	win     map[uint32]int64
	ended   map[uint32]bool // streams the hub ended: nothing more is sent on them
}

func dialFlowH2(t *testing.T, addr string) *flowH2 {
	t.Helper()
	r := openH2(t, addr)
	c := r.c
	f := &flowH2{rawH2: r, cond: sync.NewCond(&r.mu), connWin: 65535, initWin: 65535, win: map[uint32]int64{}, ended: map[uint32]bool{}}
	rd := http2.NewFramer(nil, c)
	go func() {
		for {
			fr, err := rd.ReadFrame()
			if err != nil {
				return
			}
			r.mu.Lock()
			switch fr := fr.(type) {
			case *http2.SettingsFrame:
				if !fr.IsAck() {
					if v, ok := fr.Value(http2.SettingInitialWindowSize); ok {
						d := int64(v) - f.initWin
						f.initWin = int64(v)
						for id := range f.win {
							f.win[id] += d
						}
					}
					_ = r.fr.WriteSettingsAck()
				}
			case *http2.PingFrame:
				if !fr.IsAck() {
					_ = r.fr.WritePing(true, fr.Data)
				}
			case *http2.WindowUpdateFrame:
				if fr.StreamID == 0 {
					f.connWin += int64(fr.Increment)
				} else {
					f.win[fr.StreamID] += int64(fr.Increment)
				}
			case *http2.RSTStreamFrame:
				f.ended[fr.StreamID] = true
				r.resets <- fr.StreamID
			case *http2.HeadersFrame:
				if fr.StreamEnded() {
					f.ended[fr.StreamID] = true
					r.resets <- fr.StreamID
				}
			}
			f.cond.Broadcast()
			r.mu.Unlock()
		}
	}()
	return f
}

// sendPartial opens a call of method and sends a gRPC message prefix
// announcing msgLen bytes, then msgLen-1 of them: the last byte never comes.
func (f *flowH2) sendPartial(method string, msgLen int) {
	id := f.next
	f.open(method)
	f.mu.Lock()
	f.win[id] += f.initWin
	f.mu.Unlock()
	pending := make([]byte, 5+msgLen-1)
	pending[1], pending[2], pending[3], pending[4] = byte(msgLen>>24), byte(msgLen>>16), byte(msgLen>>8), byte(msgLen)
	for len(pending) > 0 {
		f.mu.Lock()
		deadline := time.Now().Add(10 * time.Second)
		for !f.ended[id] && (f.connWin <= 0 || f.win[id] <= 0) {
			if time.Now().After(deadline) {
				f.mu.Unlock()
				f.t.Fatalf("stream %d: no window after %d bytes left", id, len(pending))
			}
			go func() { time.Sleep(100 * time.Millisecond); f.mu.Lock(); f.cond.Broadcast(); f.mu.Unlock() }()
			f.cond.Wait()
		}
		if f.ended[id] { // refused: the rest is not sent
			f.mu.Unlock()
			return
		}
		n := int64(min(len(pending), 16384))
		n = min(n, f.connWin, f.win[id])
		err := f.fr.WriteData(id, false, pending[:n])
		f.connWin -= n
		f.win[id] -= n
		f.mu.Unlock()
		if err != nil {
			f.t.Fatal(err)
		}
		pending = pending[n:]
	}
}

// TestUnauthenticatedPartialUnaryMessagesHoldNoMemory: a peer without a
// token made the hub hold 4 MiB per unary call it left one byte short, for
// as many calls as it liked (133 MiB with 32 calls): auth never ran (it
// waited for the whole message). Refused on the headers, they hold
// nothing.
func TestUnauthenticatedPartialUnaryMessagesHoldNoMemory(t *testing.T) {
	_, hash, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	v := auth.NewVerifier(map[string]auth.Principal{hash: {Name: "trainer", Role: auth.Trainer, Scopes: []string{"*"}}})
	h, err := New(Config{Listen: "127.0.0.1:0", Auth: v, Logger: testkit.Logger(), Limits: Limits{MaxStreamsPerPeer: 3}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	time.Sleep(200 * time.Millisecond)
	before := heap()
	f := dialFlowH2(t, h.Addr().String())
	time.Sleep(200 * time.Millisecond)
	const calls, msgLen = 32, 4 << 20
	for i := 0; i < calls; i++ {
		f.sendPartial("/rlhub.v1.ModelStore/List", msgLen)
	}
	time.Sleep(2 * time.Second)
	mid := heap()
	time.Sleep(12 * time.Second)
	after := heap()
	t.Logf("hub heap in use: %d MiB before, %d MiB after %d calls each %d bytes short of 1 byte, %d MiB 12 s later; streams the hub ended: %d",
		before>>20, mid>>20, calls, msgLen, after>>20, len(f.resets))
	if grown := int64(after) - int64(before); grown > 32<<20 {
		t.Fatalf("an unauthenticated peer holds %d MiB of the hub's heap with %d unfinished unary messages over 1 connection", grown>>20, calls)
	}
}

// TestUnaryCallsInProgressAreCapped: a peer with a valid token may still
// leave unary calls waiting for their messages (until they are due:
// TestUnaryMessageIsDue); the calls a peer has in
// progress, counted from their headers, are capped at twice
// --max-streams-per-peer, the rest refused at once.
func TestUnaryCallsInProgressAreCapped(t *testing.T) {
	tok, hash, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	v := auth.NewVerifier(map[string]auth.Principal{hash: {Name: "trainer", Role: auth.Trainer, Scopes: []string{""}}})
	const capStreams, calls = 3, 50
	h, err := New(Config{Listen: "127.0.0.1:0", Auth: v, Logger: testkit.Logger(), Limits: Limits{MaxStreamsPerPeer: capStreams}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	r := dialRawH2(t, h.Addr().String())
	for range calls {
		r.open("/rlhub.v1.ModelStore/List", [2]string{auth.TokenHeader, "Bearer " + tok})
	}
	testkit.Eventually(t, 10*time.Second, "the calls past the cap to be refused", func() bool {
		return len(r.resets) >= calls-2*capStreams
	})
	if held := h.calls.Held("127.0.0.1"); held != 2*capStreams {
		t.Errorf("calls in progress %d, want the cap %d", held, 2*capStreams)
	}
	r.c.Close() // the held calls end with their connection: their slots come back
	testkit.Eventually(t, 10*time.Second, "the slots to be given back", func() bool { return h.calls.Held("127.0.0.1") == 0 })
}

// TestUnaryMessageIsDue: a unary call with a valid token whose request
// message never comes is answered DeadlineExceeded once its message is
// overdue (--body-timeout plus the largest message at --body-min-rate),
// and its place among the peer's calls comes back. Before, it waited for
// its message as long as its peer kept the connection, holding a handler
// goroutine and a place among the calls of its peer.
func TestUnaryMessageIsDue(t *testing.T) {
	tok, hash, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	v := auth.NewVerifier(map[string]auth.Principal{hash: {Name: "reader", Role: auth.Reader, Scopes: []string{""}}})
	h, err := New(Config{Listen: "127.0.0.1:0", Auth: v, Logger: testkit.Logger(),
		Limits: Limits{BodyTimeout: 300 * time.Millisecond, BodyMinRate: 1 << 40}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(h.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Cancelled (not timed out) when the hub never answers, so that only
	// the hub's own deadline makes DeadlineExceeded.
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), auth.TokenHeader, "Bearer "+tok))
	defer cancel()
	stop := time.AfterFunc(30*time.Second, cancel)
	defer stop.Stop()
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, rlhubv1.ModelStore_List_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(&rlhubv1.StoreListResponse{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a unary call whose message never came: %v, want DeadlineExceeded from the hub", err)
	}
	testkit.Eventually(t, 10*time.Second, "the call's place to come back", func() bool { return h.calls.Held("127.0.0.1") == 0 })
	// A call whose message comes is served as before.
	if _, err := rlhubv1.NewModelStoreClient(conn).List(ctx, &rlhubv1.StoreListRequest{}); err != nil {
		t.Fatal(err)
	}
}
