package hub

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/optim"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

func storeAs(t testing.TB, addr, token string) *storerpc.Client {
	t.Helper()
	cfg, err := dial.Files{Token: token}.Load()
	if err != nil {
		t.Fatal(err)
	}
	c, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr, Dial: cfg, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// blobOf is a safetensors blob of n float32s tagged with by.
func blobOf(t testing.TB, n int, by string) []byte {
	t.Helper()
	sd, err := tensor.NewStateDict(tensor.NewF32("w", int64(n)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := safetensors.Encode(sd, map[string]string{"by": by})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newest(t testing.TB, ctx context.Context, c *storerpc.Client, name string) (uint64, string) {
	t.Helper()
	snap, err := c.Get(ctx, name, 0)
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return snap.Version, snap.Metadata["by"]
}

// TestRemotePushOwnedByItsToken: a remote push over gRPC records its
// token's identity as the model's owner; another trainer token cannot
// overwrite the model (PermissionDenied, nothing changes); an admin can,
// and the owner stays; the reducer may take the model over when an admin
// registers it, and then the trainer's pushes are refused too. Ownership
// survives a hub restart (the file store's manifest).
func TestRemotePushOwnedByItsToken(t *testing.T) {
	f := newTokenFile(t)
	alice := f.add(t, auth.Principal{Name: "alice", Role: auth.Trainer, Scopes: []string{""}})
	bob := f.add(t, auth.Principal{Name: "bob", Role: auth.Trainer, Scopes: []string{""}})
	root := f.add(t, auth.Principal{Name: "root", Role: auth.Admin, Scopes: []string{""}})
	dir := t.TempDir()
	h := startTokenHub(t, f, func(c *Config) { c.DataDir = dir; c.Reducer.BatchSize = 1 })
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, b, r := storeAs(t, addr, alice), storeAs(t, addr, bob), storeAs(t, addr, root)

	info, err := a.Push(ctx, store.PushRequest{Name: "m", Version: 1, Expect: store.ExpectAny, Blob: blobOf(t, 8, "alice")})
	if err != nil || info.Owner != "token:alice" {
		t.Fatalf("alice's first push: %+v, %v", info, err)
	}
	if _, err := b.Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: store.ExpectAny, Blob: blobOf(t, 8, "bob")}); !errors.Is(err, errs.ErrPermission) || !strings.Contains(err.Error(), "token:alice") {
		t.Fatalf("bob over alice's model: %v, want PermissionDenied naming the owner", err)
	}
	if v, by := newest(t, ctx, a, "m"); v != 1 || by != "alice" {
		t.Fatalf("after bob's refused push: v%d by %s", v, by)
	}
	if info, err := r.Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: store.ExpectAny, Blob: blobOf(t, 8, "root")}); err != nil || info.Owner != "token:alice" {
		t.Fatalf("admin over alice's model: %+v, %v (want it to land, alice still the owner)", info, err)
	}
	if _, err := a.Push(ctx, store.PushRequest{Name: "m", Version: 3, Expect: store.ExpectAny, Blob: blobOf(t, 8, "alice")}); err != nil {
		t.Fatalf("alice after the admin: %v", err)
	}

	// A restart keeps the owner.
	h.Close()
	h = startTokenHub(t, f, func(c *Config) { c.DataDir = dir; c.Reducer.BatchSize = 1 })
	addr = h.Addr().String()
	a, b = storeAs(t, addr, alice), storeAs(t, addr, bob)
	if _, err := b.Push(ctx, store.PushRequest{Name: "m", Version: 4, Expect: store.ExpectAny, Blob: blobOf(t, 8, "bob")}); !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("bob after a restart: %v", err)
	}

	// An admin registers alice's model with the reducer: it is the
	// reducer's from then on.
	rcfg, _ := dial.Files{Token: root}.Load()
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: addr, Dial: rcfg, ClientID: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, _, err := rc.Register(ctx, reducer.ModelConfig{Model: "m", Optimizer: optim.Config{Kind: optim.SGD, LR: 0.1}}); err != nil {
		t.Fatalf("admin registers alice's model: %v", err)
	}
	if _, err := a.Push(ctx, store.PushRequest{Name: "m", Version: 9, Expect: store.ExpectAny, Blob: blobOf(t, 8, "alice")}); !errors.Is(err, errs.ErrPermission) || !strings.Contains(err.Error(), "reducer") {
		t.Fatalf("alice over the reducer's model: %v", err)
	}
}

// TestTokenQuotas: a token with max-models=2 and max-bytes creates two
// models; a third is refused with ResourceExhausted from the header (the
// store is unchanged and the counter rises), so is a version that would
// pass max-bytes; another token is not affected; deleting one of its
// models makes room again.
func TestTokenQuotas(t *testing.T) {
	f := newTokenFile(t)
	small := blobOf(t, 16, "q")
	q := f.add(t, auth.Principal{Name: "q", Role: auth.Trainer, Scopes: []string{""}, Quota: auth.Quota{Models: 2, Bytes: int64(3 * len(small))}})
	free := f.add(t, auth.Principal{Name: "free", Role: auth.Trainer, Scopes: []string{""}})
	root := f.add(t, auth.Principal{Name: "root", Role: auth.Admin, Scopes: []string{""}})
	h := startTokenHub(t, f, nil)
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	qc, fc, rc := storeAs(t, addr, q), storeAs(t, addr, free), storeAs(t, addr, root)

	for _, name := range []string{"q1", "q2"} {
		if _, err := qc.Push(ctx, store.PushRequest{Name: name, Version: 1, Blob: small}); err != nil {
			t.Fatalf("push %s within the quota: %v", name, err)
		}
	}
	_, err := qc.Push(ctx, store.PushRequest{Name: "q3", Version: 1, Expect: store.ExpectAny, Blob: small})
	if !errors.Is(err, errs.ErrFull) || !strings.Contains(err.Error(), "max-models") {
		t.Fatalf("a third model: %v, want ResourceExhausted naming max-models", err)
	}
	if _, err := qc.Get(ctx, "q3", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("the refused model exists: %v", err)
	}
	// q1 and q2 hold 2 blobs; a version of q1 twice as big makes 3.
	big := blobOf(t, 16*2+len(small)/4, "q") // over 2× small
	_, err = qc.Push(ctx, store.PushRequest{Name: "q1", Version: 2, Expect: store.ExpectAny, Blob: big})
	if !errors.Is(err, errs.ErrFull) || !strings.Contains(err.Error(), "max-bytes") {
		t.Fatalf("a version past max-bytes: %v (blob %d, quota %d)", err, len(big), 3*len(small))
	}
	if v, _ := newest(t, ctx, qc, "q1"); v != 1 {
		t.Fatalf("q1 at v%d after the refused push", v)
	}
	if _, err := fc.Push(ctx, store.PushRequest{Name: "f3", Version: 1, Expect: store.ExpectAny, Blob: small}); err != nil {
		t.Fatalf("another token: %v", err)
	}
	st := h.cfg.Auth.Stats()
	if st.QuotaModelsFull != 1 || st.QuotaBytesFull != 1 {
		t.Fatalf("quota counters %+v, want 1 and 1", st)
	}
	if err := rc.Delete(ctx, "q2"); err != nil {
		t.Fatal(err)
	}
	if _, err := qc.Push(ctx, store.PushRequest{Name: "q3", Version: 1, Expect: store.ExpectAny, Blob: small}); err != nil {
		t.Fatalf("after a delete made room: %v", err)
	}
}

// TestTokenRateQuota: a token with max-rps has a bucket of one request
// that refills every 100 s here: its second request — a gRPC call or a
// data-plane request — fails with ResourceExhausted; another token is
// not slowed.
func TestTokenRateQuota(t *testing.T) {
	f := newTokenFile(t)
	slow := f.add(t, auth.Principal{Name: "slow", Role: auth.Reader, Scopes: []string{""}, Quota: auth.Quota{Rate: 0.01}})
	fast := f.add(t, auth.Principal{Name: "fast", Role: auth.Reader, Scopes: []string{""}})
	h := startTokenHub(t, f, nil)
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	scfg, sconn := dialToken(t, addr, slow)
	_, fconn := dialToken(t, addr, fast)
	if _, err := rlhubv1.NewModelStoreClient(sconn).List(ctx, &rlhubv1.StoreListRequest{}); err != nil {
		t.Fatalf("the first request: %v", err)
	}
	_, err := rlhubv1.NewModelStoreClient(sconn).List(ctx, &rlhubv1.StoreListRequest{})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max-rps") {
		t.Fatalf("the second request: %v, want ResourceExhausted naming max-rps", err)
	}
	bc := scfg.Bulk()
	defer bc.Close()
	if err := bc.Call(ctx, addr, "rlhub.v1.ModelStore/Pull", &rlhubv1.StorePullRequest{Model: "none"}, nil, nil); !errors.Is(err, errs.ErrFull) {
		t.Fatalf("a data-plane request past the rate: %v", err)
	}
	for range 20 {
		if _, err := rlhubv1.NewModelStoreClient(fconn).List(ctx, &rlhubv1.StoreListRequest{}); err != nil {
			t.Fatalf("a token without a rate: %v", err)
		}
	}
	if got := h.cfg.Auth.Stats().QuotaRateFull; got != 2 {
		t.Fatalf("rate refusals %d, want 2", got)
	}
}
