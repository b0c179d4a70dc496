package hub

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// tokenFile is a token file on disk that a test rewrites while the hub
// serves it (through a rename, as `rlhub token revoke` does).
type tokenFile struct {
	path  string
	lines map[string]string // by name
}

func newTokenFile(t testing.TB) *tokenFile {
	return &tokenFile{path: filepath.Join(t.TempDir(), "tokens"), lines: map[string]string{}}
}

// add issues a token for p and returns it (the file is not written).
func (f *tokenFile) add(t testing.TB, p auth.Principal) string {
	tok, hash, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	f.lines[p.Name] = auth.Line(hash, p)
	return tok
}

func (f *tokenFile) write(t testing.TB) {
	var b strings.Builder
	for _, l := range f.lines {
		b.WriteString(l + "\n")
	}
	tmp := f.path + ".new"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		t.Fatal(err)
	}
}

// startTokenHub serves a hub whose tokens come from f, reloaded every
// 20 ms.
func startTokenHub(t testing.TB, f *tokenFile, mod func(*Config)) *Hub {
	t.Helper()
	f.write(t)
	v, err := auth.LoadFile(f.path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: "127.0.0.1:0", Auth: v, AuthFile: f.path, AuthReloadInterval: 20 * time.Millisecond, Logger: testkit.Logger()}
	if mod != nil {
		mod(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func dialToken(t testing.TB, addr, token string) (dial.Config, *grpc.ClientConn) {
	t.Helper()
	cfg, err := dial.Files{Token: token}.Load()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := cfg.GRPC(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return cfg, conn
}

// openWatch starts a model-store watch of a model with no version yet (it
// waits in the hub) and returns where its end arrives.
func openWatch(t testing.TB, ctx context.Context, conn *grpc.ClientConn, model string) <-chan error {
	w, err := rlhubv1.NewModelStoreClient(conn).Watch(ctx, &rlhubv1.StoreWatchRequest{Model: model})
	if err != nil {
		t.Fatal(err)
	}
	end := make(chan error, 1)
	go func() {
		for {
			if _, err := w.Recv(); err != nil {
				end <- err
				return
			}
		}
	}()
	return end
}

func wantCode(t testing.TB, what string, err error, code codes.Code, text string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), text) {
		t.Fatalf("%s: got %v, want %v containing %q", what, err, code, text)
	}
}

// TestRevokedTokenIsCutWithoutRestart: a token removed from the token
// file while the hub serves is refused on the next gRPC call and the next
// data-plane request of a connection it opened before, and its open
// streams (a watch) and long polls (an ARS lease, a data-plane watch)
// end with Unauthenticated; a token file that no longer parses changes nothing.
func TestRevokedTokenIsCutWithoutRestart(t *testing.T) {
	f := newTokenFile(t)
	victim := f.add(t, auth.Principal{Name: "victim", Role: auth.Worker, Scopes: []string{""}})
	admin := f.add(t, auth.Principal{Name: "boss", Role: auth.Admin, Scopes: []string{""}})
	h := startTokenHub(t, f, nil)
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	vcfg, vconn := dialToken(t, addr, victim)
	_, aconn := dialToken(t, addr, admin)
	bc := vcfg.Bulk()
	defer bc.Close()
	pull := func() error {
		return bc.Call(ctx, addr, "rlhub.v1.ModelStore/Pull", &rlhubv1.StorePullRequest{Model: "t/none"}, nil, nil)
	}
	if err := pull(); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("data-plane pull before the revocation: %v, want not found", err)
	}
	watchEnd := openWatch(t, ctx, vconn, "t/none")
	ars := rlhubv1.NewARSClient(vconn)
	att, err := ars.Attach(ctx, &rlhubv1.ARSAttachRequest{Name: "w"})
	if err != nil {
		t.Fatal(err)
	}
	leaseEnd := make(chan error, 1)
	go func() {
		_, err := ars.Lease(ctx, &rlhubv1.ARSLeaseRequest{WorkerId: att.WorkerId, MaxTasks: 1, WaitMs: 60_000})
		leaseEnd <- err
	}()
	// A data-plane watch: a long poll of up to storerpc.BulkWatchWait that
	// would answer "not modified" (no error) if it were not cut.
	bc2 := vcfg.Bulk()
	defer bc2.Close()
	dpEnd := make(chan error, 1)
	go func() {
		dpEnd <- bc2.Call(ctx, addr, "rlhub.v1.ModelStore/Watch", &rlhubv1.StoreWatchRequest{Model: "t/none"}, nil, nil)
	}()
	testkit.Eventually(t, 10*time.Second, "the watches and the lease to be in the hub", func() bool { return h.cfg.Auth.LiveCalls() >= 3 })

	// A broken file is not loaded: every token keeps working.
	if err := os.WriteFile(f.path+".new", []byte("sha256:nothex role=admin scope=*\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(f.path+".new", f.path); err != nil {
		t.Fatal(err)
	}
	h.ReloadAuth()
	if _, err := rlhubv1.NewModelStoreClient(vconn).List(ctx, &rlhubv1.StoreListRequest{}); err != nil {
		t.Fatalf("a broken token file revoked a token: %v", err)
	}

	delete(f.lines, "victim")
	f.write(t)
	wantCode(t, "the open watch", testkit.Recv(t, watchEnd, 10*time.Second, "the watch to be cut"), codes.Unauthenticated, `token "victim" was revoked`)
	if err := testkit.Recv(t, dpEnd, 10*time.Second, "the data-plane watch to be cut"); !errors.Is(err, errs.ErrUnauthenticated) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("the data-plane watch in progress: %v, want unauthenticated (revoked)", err)
	}
	wantCode(t, "the ARS lease long poll", testkit.Recv(t, leaseEnd, 10*time.Second, "the lease to be cut"), codes.Unauthenticated, "revoked")
	_, err = rlhubv1.NewModelStoreClient(vconn).List(ctx, &rlhubv1.StoreListRequest{})
	wantCode(t, "the next unary call", err, codes.Unauthenticated, "unknown token")
	if err := pull(); !errors.Is(err, errs.ErrUnauthenticated) {
		t.Fatalf("the next data-plane request: %v, want unauthenticated", err)
	}
	if _, err := rlhubv1.NewModelStoreClient(aconn).List(ctx, &rlhubv1.StoreListRequest{}); err != nil {
		t.Fatalf("the admin token, still in the file: %v", err)
	}
	testkit.Eventually(t, 10*time.Second, "no call tracked after the cut", func() bool { return h.cfg.Auth.LiveCalls() == 0 })
}

// TestExpiredTokenIsRefusedAndItsStreamsEnd: a token past its expires= is
// refused, and a watch it opened before ends when it expires.
func TestExpiredTokenIsRefusedAndItsStreamsEnd(t *testing.T) {
	f := newTokenFile(t)
	soon := time.Now().Add(1500 * time.Millisecond)
	short := f.add(t, auth.Principal{Name: "short", Role: auth.Reader, Scopes: []string{""}, Expires: soon})
	h := startTokenHub(t, f, nil)
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, conn := dialToken(t, addr, short)
	if _, err := rlhubv1.NewModelStoreClient(conn).List(ctx, &rlhubv1.StoreListRequest{}); err != nil && time.Now().Before(soon) {
		t.Fatalf("before expiry: %v", err)
	}
	end := openWatch(t, ctx, conn, "t/none")
	wantCode(t, "the watch open at expiry", testkit.Recv(t, end, 20*time.Second, "the watch to end at expiry"), codes.Unauthenticated, `token "short" expired`)
	_, err := rlhubv1.NewModelStoreClient(conn).List(ctx, &rlhubv1.StoreListRequest{})
	wantCode(t, "a call after expiry", err, codes.Unauthenticated, "expired at")
	bc := cfg.Bulk()
	defer bc.Close()
	err = bc.Call(ctx, addr, "rlhub.v1.ModelStore/Pull", &rlhubv1.StorePullRequest{Model: "t/none"}, nil, nil)
	if !errors.Is(err, errs.ErrUnauthenticated) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("a data-plane request after expiry: %v", err)
	}
}
