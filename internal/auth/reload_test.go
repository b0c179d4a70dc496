package auth

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
)

func TestExpiryAndQuotaRoundTrip(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC)
	tok, hash, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	want := Principal{Name: "a", Role: Trainer, Scopes: []string{"ppo/"}, Expires: t0.Add(time.Hour), Quota: Quota{Models: 3, Bytes: 5 << 20, Rate: 0.5}}
	got, err := ParseFile(strings.NewReader(Line(hash, want)))
	if err != nil || !got[hash].equal(want) {
		t.Fatalf("round trip: %+v, %v; want %+v", got[hash], err, want)
	}
	v := NewVerifier(got)
	now := t0
	v.SetClock(func() time.Time { return now })
	if _, err := v.Authenticate(tok); err != nil {
		t.Fatalf("before expiry: %v", err)
	}
	now = t0.Add(time.Hour)
	if _, err := v.Authenticate(tok); !errors.Is(err, errs.ErrUnauthenticated) || !strings.Contains(err.Error(), "expired at 2026-12-01T14:00:00Z") {
		t.Fatalf("at expiry: %v", err)
	}
	for in, n := range map[string]int64{"0": 0, "12": 12, "4KiB": 4096, "2GiB": 2 << 30} {
		if got, err := ParseBytes(in); err != nil || got != n {
			t.Errorf("ParseBytes(%q) = %d, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "-1", "1PB", "9999999999TiB", "x"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) accepted", bad)
		}
	}
	for _, line := range []string{hash + " role=admin scope=* max-rps=-1", hash + " role=admin scope=* max-rps=NaN", hash + " role=admin scope=* expires=tomorrow", hash + " role=admin scope=* max-models=-2", hash + " role=admin scope=* max-bytes=lots"} {
		if _, err := ParseFile(strings.NewReader(line)); err == nil {
			t.Errorf("%q accepted", line)
		}
	}
}

// Replace cuts exactly the calls of tokens that went or changed, with an
// Unauthenticated cause; an unchanged line keeps its calls.
func TestReplaceCutsTheCallsOfRevokedTokens(t *testing.T) {
	keep := Principal{Name: "keep", Role: Reader, Scopes: []string{""}}
	gone := Principal{Name: "gone", Role: Reader, Scopes: []string{""}}
	demoted := Principal{Name: "demoted", Role: Admin, Scopes: []string{""}}
	v := NewVerifier(map[string]Principal{"k": keep, "g": gone, "d": demoted})
	ctxs := map[string]context.Context{}
	for h, p := range map[string]Principal{"k": keep, "g": gone, "d": demoted} {
		ctx, done, err := v.track(context.Background(), h, p)
		if err != nil {
			t.Fatal(err)
		}
		defer done()
		ctxs[p.Name] = ctx
	}
	lower := demoted
	lower.Role = Reader
	if cut := v.Replace(map[string]Principal{"k": keep, "d": lower}); cut != 2 {
		t.Fatalf("cut %d calls, want 2", cut)
	}
	if ctxs["keep"].Err() != nil {
		t.Fatal("an unchanged token's call was cut")
	}
	if c := cutCause(ctxs["gone"]); c == nil || !strings.Contains(c.Error(), "revoked") {
		t.Fatalf("revoked: cause %v", c)
	}
	if c := cutCause(ctxs["demoted"]); c == nil || !strings.Contains(c.Error(), "changed") {
		t.Fatalf("changed: cause %v", c)
	}
	if n := v.LiveCalls(); n != 1 {
		t.Fatalf("%d live calls, want 1", n)
	}
}

// WatchFile reloads on a change of the file and on a reload request, and
// a file that fails its checks leaves the tokens as they were.
func TestWatchFileReloads(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tokens")
	tokA, hA, _ := NewToken()
	tokB, hB, _ := NewToken()
	write := func(s string) {
		if err := os.WriteFile(path+".tmp", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write(Line(hA, Principal{Name: "a", Role: Reader, Scopes: []string{""}}) + "\n")
	v, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	reload := make(chan struct{})
	go func() { defer close(done); v.WatchFile(ctx, path, -1, reload, testkit.Logger()) }()
	defer func() { cancel(); <-done }()
	write(Line(hB, Principal{Name: "b", Role: Reader, Scopes: []string{""}}) + "\n")
	reload <- struct{}{}
	testkit.Eventually(t, 10*time.Second, "the reload", func() bool { _, err := v.Authenticate(tokB); return err == nil })
	if _, err := v.Authenticate(tokA); err == nil {
		t.Fatal("a removed token still authenticates")
	}
	write("garbage\n")
	reload <- struct{}{}
	reload <- struct{}{} // the first has been handled
	if _, err := v.Authenticate(tokB); err != nil {
		t.Fatalf("a bad file changed the tokens: %v", err)
	}
}

// A call tracked after its token was removed (a reload between its
// authentication and its tracking) is refused, before it runs.
func TestTrackAfterRevocationRefuses(t *testing.T) {
	p := Principal{Name: "late", Role: Reader, Scopes: []string{""}}
	v := NewVerifier(map[string]Principal{})
	if _, _, err := v.track(context.Background(), "h", p); !errors.Is(err, errs.ErrUnauthenticated) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("err %v", err)
	}
	if v.LiveCalls() != 0 {
		t.Fatal("a cut call is tracked")
	}
}

// A token with max-rps gets a bucket of ⌈rate⌉ requests refilled at the
// rate (by the verifier's clock); past it: ErrFull, counted.
func TestRateQuota(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC)
	now := t0
	p := Principal{Name: "r", Role: Reader, Scopes: []string{""}, Quota: Quota{Rate: 2}}
	free := Principal{Name: "f", Role: Reader, Scopes: []string{""}}
	v := NewVerifier(map[string]Principal{"r": p, "f": free})
	v.SetClock(func() time.Time { return now })
	for i := range 2 {
		if err := v.allowRate(p); err != nil {
			t.Fatalf("request %d within the burst: %v", i, err)
		}
	}
	if err := v.allowRate(p); !errors.Is(err, errs.ErrFull) || !strings.Contains(err.Error(), "max-rps") {
		t.Fatalf("past the burst: %v", err)
	}
	for range 100 {
		if err := v.allowRate(free); err != nil {
			t.Fatalf("a token without a rate: %v", err)
		}
	}
	now = t0.Add(500 * time.Millisecond) // one request refilled
	if err := v.allowRate(p); err != nil {
		t.Fatalf("after a refill: %v", err)
	}
	if got := v.Stats().QuotaRateFull; got != 1 {
		t.Fatalf("rate refusals %d, want 1", got)
	}
}
