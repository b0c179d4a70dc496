package hub

import (
	"context"
	"errors"
	"math"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// hubState is what a hostile client must not change: every model's
// version, epoch and owner, the ARS runs, and the tokens.
type hubState struct {
	Models map[string][3]string
	Runs   int
	Tokens int
}

func stateOf(t *testing.T, ctx context.Context, h *Hub) hubState {
	t.Helper()
	infos, err := h.Store().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := hubState{Models: map[string][3]string{}, Runs: len(h.ars.Stats().Runs), Tokens: h.cfg.Auth.Len()}
	for _, in := range infos {
		s.Models[in.Name] = [3]string{strconv.FormatUint(in.Version, 10), strconv.FormatUint(in.Epoch, 10), in.Owner}
	}
	return s
}

// TestHostileClients re-runs issue 16's opening attacks and the new ones
// against one hub with tokens: each is refused with its precise code, and
// afterwards every model's version, epoch and owner, the ARS runs and the
// tokens are as they were, and the reducer still applies a legitimate
// gradient.
func TestHostileClients(t *testing.T) {
	if testing.Short() {
		t.Skip("many connections and an ARS run")
	}
	f := newTokenFile(t)
	root := f.add(t, auth.Principal{Name: "root", Role: auth.Admin, Scopes: []string{""}})
	alice := f.add(t, auth.Principal{Name: "alice", Role: auth.Trainer, Scopes: []string{"m"}})
	mallory := f.add(t, auth.Principal{Name: "mallory", Role: auth.Trainer, Scopes: []string{""}})
	quota := f.add(t, auth.Principal{Name: "quota", Role: auth.Trainer, Scopes: []string{"q"}, Quota: auth.Quota{Models: 1}})
	victim := f.add(t, auth.Principal{Name: "victim", Role: auth.Reader, Scopes: []string{""}})
	short := f.add(t, auth.Principal{Name: "short", Role: auth.Reader, Scopes: []string{""}, Expires: time.Now().Add(2 * time.Second)})
	h := startTokenHub(t, f, func(c *Config) {
		c.Reducer.BatchSize = 1
		c.Limits.FrameTimeout = time.Second
		c.Limits.MaxConnsPerPeer = -1
	})
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The set-up a real run has: alice's model m, registered with the
	// reducer by root; alice's own model m-alice; a quota token's one
	// model; two ARS runs, and a worker token scoped to the newer one.
	a, mal, q := storeAs(t, addr, alice), storeAs(t, addr, mallory), storeAs(t, addr, quota)
	for _, name := range []string{"m", "m-alice"} {
		if _, err := a.Push(ctx, store.PushRequest{Name: name, Version: 1, Expect: store.ExpectAny, Blob: blobOf(t, 1024, "alice")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Push(ctx, store.PushRequest{Name: "q1", Version: 1, Expect: store.ExpectAny, Blob: blobOf(t, 8, "q")}); err != nil {
		t.Fatal(err)
	}
	rootDial, _ := dial.Files{Token: root}.Load()
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, Dial: rootDial, ClientID: "root"})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}); err != nil {
		t.Fatal(err)
	}
	_, rootConn := dialToken(t, addr, root)
	ars := rlhubv1.NewARSClient(rootConn)
	spec := &rlhubv1.ARSRunSpec{Env: "CartPole-v1", Seed: 1, Directions: 4, Top: 2, EvalEvery: 1 << 30, MaxIterations: 1000}
	var runs []string
	for range 2 {
		r, err := ars.StartRun(ctx, &rlhubv1.ARSStartRunRequest{Spec: spec})
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r.RunId)
	}
	mine := runs[1]
	worker := f.add(t, auth.Principal{Name: "worker", Role: auth.Worker, Scopes: []string{auth.ARSModelPrefix + mine}})
	f.write(t)
	h.ReloadAuth()
	testkit.Eventually(t, 10*time.Second, "the worker token to load", func() bool { return h.cfg.Auth.Len() == 7 })
	_, victimConn := dialToken(t, addr, victim)
	victimWatch := openWatch(t, ctx, victimConn, "none")
	_, shortConn := dialToken(t, addr, short)
	shortWatch := openWatch(t, ctx, shortConn, "none")
	before := stateOf(t, ctx, h)

	code := func(what string, err error, want codes.Code) {
		t.Helper()
		got := status.Code(err)
		if err != nil && got == codes.Unknown { // a client that returns errs conditions
			for c, e := range map[codes.Code]error{codes.Unauthenticated: errs.ErrUnauthenticated, codes.PermissionDenied: errs.ErrPermission,
				codes.InvalidArgument: errs.ErrInvalid, codes.ResourceExhausted: errs.ErrFull, codes.NotFound: errs.ErrNotFound} {
				if errors.Is(err, e) {
					got = c
				}
			}
		}
		if got != want {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}

	// 1. An anonymous push, and a push over the reducer's model by an
	// unscoped trainer: the reducer must keep applying gradients.
	anon := storeAs(t, addr, "")
	_, err = anon.Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: store.ExpectAny, Blob: blobOf(t, 1024, "anon")})
	code("anonymous push", err, codes.Unauthenticated)
	_, err = mal.Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: store.ExpectAny, Blob: blobOf(t, 1024, "mallory")})
	code("push over the reducer's model", err, codes.PermissionDenied)
	// 2. Another trainer over alice's model.
	_, err = mal.Push(ctx, store.PushRequest{Name: "m-alice", Version: 2, Expect: store.ExpectAny, Blob: blobOf(t, 1024, "mallory")})
	code("push over another token's model", err, codes.PermissionDenied)
	// 3. Versions and epochs of 2^64−1.
	_, err = mal.Push(ctx, store.PushRequest{Name: "evil", Version: math.MaxUint64, Expect: store.ExpectAny, Blob: blobOf(t, 8, "mallory")})
	code("version 2^64−1", err, codes.InvalidArgument)
	_, err = mal.Push(ctx, store.PushRequest{Name: "evil", Version: 1, Epoch: math.MaxUint64, Expect: store.ExpectAny, Blob: blobOf(t, 8, "mallory")})
	code("epoch 2^64−1", err, codes.InvalidArgument)
	// 4. A 256 MiB gradient body claimed for a 4 KiB model: refused from
	// the header (frame kind 3), the body never asked for.
	hdr, _ := proto.Marshal(&rlhubv1.ReducerPushHeader{ClientId: "mallory", Seq: 1, Blob: &rlhubv1.BlobInfo{Model: "m", Version: 1, TotalBytes: 256 << 20}})
	if kind, st := rawBulkRequestAs(t, addr, mallory, reducer.BulkPushMethod, hdr); kind != 3 || codes.Code(st.GetCode()) != codes.InvalidArgument {
		t.Errorf("oversize gradient: frame kind %d status %v, want a refusal before the body", kind, st)
	}
	// 5. An ARS policy of two 4096-wide hidden layers (even for an admin).
	big := proto.Clone(spec).(*rlhubv1.ARSRunSpec)
	big.Hidden = []uint32{4096, 4096}
	_, err = ars.StartRun(ctx, &rlhubv1.ARSStartRunRequest{Spec: big})
	code("a 16M-parameter ARS policy", err, codes.InvalidArgument)
	// 6. Half-open data-plane connections: the magic, the token and part
	// of a request; each is closed by the hub within its frame timeout.
	var half []net.Conn
	defer func() {
		for _, c := range half {
			c.Close()
		}
	}()
	partial := append(bulk.Hello(mallory), 1, 20, 0)
	for range 200 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		half = append(half, c)
		c.Write(partial)
	}
	for i, c := range half {
		c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a hang guard: the hub's bound is 1 s
		var b [64]byte
		for {
			if _, err := c.Read(b[:]); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatalf("half-open connection %d was never closed by the hub", i)
				}
				break
			}
		}
	}
	// 7. Error text does not echo a 10 KB id.
	_, malConn := dialToken(t, addr, mallory)
	pull, err := rlhubv1.NewModelStoreClient(malConn).Pull(ctx, &rlhubv1.StorePullRequest{Model: strings.Repeat("x", 10<<10)})
	if err == nil {
		_, err = pull.Recv()
	}
	if st := status.Convert(err); st.Code() != codes.NotFound || len(st.Message()) > 512 {
		t.Errorf("a 10 KB model name: %v, %d-byte message", st.Code(), len(st.Message()))
	}
	// 8. An expired token: its open watch ended at expiry, its next call
	// is refused.
	code("the expired token's watch", testkit.Recv(t, shortWatch, 20*time.Second, "the expired token's watch to end"), codes.Unauthenticated)
	_, err = rlhubv1.NewModelStoreClient(shortConn).List(ctx, &rlhubv1.StoreListRequest{})
	code("a call with an expired token", err, codes.Unauthenticated)
	// 9. A token revoked mid-stream.
	delete(f.lines, "victim")
	f.write(t)
	code("the revoked token's watch", testkit.Recv(t, victimWatch, 20*time.Second, "the revoked token's watch to be cut"), codes.Unauthenticated)
	// 10. Quota exhaustion: nothing is created.
	_, err = q.Push(ctx, store.PushRequest{Name: "q2", Version: 1, Expect: store.ExpectAny, Blob: blobOf(t, 8, "q")})
	code("a model past max-models", err, codes.ResourceExhausted)
	// 11. A cross-run lease: the worker scoped to the newer run never
	// leases the older one's tasks, and no other token acts as its worker.
	_, wconn := dialToken(t, addr, worker)
	wc := rlhubv1.NewARSClient(wconn)
	att, err := wc.Attach(ctx, &rlhubv1.ARSAttachRequest{Name: "w"})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		l, err := wc.Lease(ctx, &rlhubv1.ARSLeaseRequest{WorkerId: att.WorkerId, MaxTasks: 1, WaitMs: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Tasks) > 0 && l.RunId != mine {
			t.Fatalf("cross-run lease: a worker scoped to %s leased %s", mine, l.RunId)
		}
	}
	_, err = rlhubv1.NewARSClient(malConn).Lease(ctx, &rlhubv1.ARSLeaseRequest{WorkerId: att.WorkerId, MaxTasks: 1})
	code("a lease as another token's worker", err, codes.PermissionDenied)
	w, err := wc.WatchRun(ctx, &rlhubv1.ARSWatchRunRequest{RunId: runs[0]})
	if err == nil {
		_, err = w.Recv()
	}
	code("watching another run", err, codes.PermissionDenied)

	// Afterwards: the hub is as it was (less the revoked token), and a
	// legitimate gradient is applied.
	after := stateOf(t, ctx, h)
	before.Tokens--
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("the hub changed:\nbefore %+v\nafter  %+v", before, after)
	}
	aliceDial, _ := dial.Files{Token: alice}.Load()
	ac, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, Dial: aliceDial, ClientID: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	sd, _ := tensor.NewStateDict(tensor.NewF32("w", 1024))
	if _, err := ac.PushGrad(ctx, "m", 0, sd); err != nil {
		t.Fatalf("a legitimate gradient: %v", err)
	}
	testkit.Eventually(t, 30*time.Second, "the legitimate gradient applied", func() bool { return h.Reducer().Stats().Total.Applied == 1 })
}
