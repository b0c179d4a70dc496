package hub

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/store"
)

// BenchmarkQuotaPush measures what a token's quota adds to a small store
// push over gRPC (it lists the store to count the token's models and
// bytes), with the token owning 10 or 1000 models, against a token
// without a quota in the same hub and run (the baseline).
func BenchmarkQuotaPush(b *testing.B) {
	for _, owned := range []int{10, 1000} {
		f := newTokenFile(b)
		limited := f.add(b, auth.Principal{Name: "limited", Role: auth.Trainer, Scopes: []string{""}, Quota: auth.Quota{Models: 1 << 20, Bytes: 1 << 50}})
		free := f.add(b, auth.Principal{Name: "free", Role: auth.Trainer, Scopes: []string{""}})
		h := startTokenHub(b, f, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		blob := blobOf(b, 64, "x")
		lc, fc := storeAs(b, h.Addr().String(), limited), storeAs(b, h.Addr().String(), free)
		for i := range owned {
			if _, err := lc.Push(ctx, store.PushRequest{Name: fmt.Sprintf("l/%d", i), Version: 1, Expect: store.ExpectAny, Blob: blob}); err != nil {
				b.Fatal(err)
			}
			if _, err := fc.Push(ctx, store.PushRequest{Name: fmt.Sprintf("f/%d", i), Version: 1, Expect: store.ExpectAny, Blob: blob}); err != nil {
				b.Fatal(err)
			}
		}
		versions := map[string]uint64{}
		for _, c := range []struct {
			name   string
			client interface {
				Push(context.Context, store.PushRequest) (store.Info, error)
			}
			model string
		}{{"no-quota", fc, "f/0"}, {"quota", lc, "l/0"}} {
			b.Run(fmt.Sprintf("owned=%d/%s", owned, c.name), func(b *testing.B) {
				for b.Loop() {
					versions[c.model]++
					if _, err := c.client.Push(ctx, store.PushRequest{Name: c.model, Version: versions[c.model] + 1, Expect: store.ExpectAny, Blob: blob}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		cancel()
		h.Close()
	}
}
