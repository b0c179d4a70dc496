package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
)

// A token-owned model: other tokens are refused, an admin writes over it
// keeping the owner, an in-process owner claims it, and then even the
// admin is refused.
func TestTokenOwnedModel(t *testing.T) {
	ctx := context.Background()
	m, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	sd, _ := tensor.NewStateDict(tensor.NewF32("w", 4))
	blob, _ := safetensors.Encode(sd, nil)
	push := func(v uint64, owner string, admin bool) (store.Info, error) {
		return m.Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: store.ExpectAny, Owner: owner, Claim: true, Admin: admin, Blob: blob})
	}
	if info, err := push(1, "token:a", false); err != nil || info.Owner != "token:a" {
		t.Fatalf("create: %+v %v", info, err)
	}
	if _, err := push(2, "token:b", false); !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("another token: %v", err)
	}
	if info, err := push(2, "token:root", true); err != nil || info.Owner != "token:a" {
		t.Fatalf("admin: %+v %v", info, err)
	}
	if err := m.Claim(ctx, "m", "token:b"); !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("a token claims another's model: %v", err)
	}
	if err := m.Claim(ctx, "m", "reducer"); err != nil {
		t.Fatalf("the reducer takes a token's model: %v", err)
	}
	if _, err := push(3, "token:root", true); !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("admin over the reducer's model: %v", err)
	}
	if _, err := push(3, "token:a", false); !errors.Is(err, errs.ErrPermission) {
		t.Fatalf("the former owner over the reducer's model: %v", err)
	}
}
