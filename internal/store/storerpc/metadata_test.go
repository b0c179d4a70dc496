package storerpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
)

// TestMetadataIsBoundedByWhatAPullCanCarry: a pull carries the version's
// safetensors metadata in its reply header (1 MiB on the data plane). A
// push of 2 MiB of metadata (within the 16 MiB header bound) was
// acknowledged, and every pull of it then failed, blaming the reader. It
// is refused now, nothing stored; metadata at the bound pushes and pulls
// whole.
func TestMetadataIsBoundedByWhatAPullCanCarry(t *testing.T) {
	mem, err := store.NewMemory(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	addr, _, _ := serveBoth(t, mem, false)
	c := newClient(t, storerpc.ClientConfig{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	blob := func(notes int) []byte {
		sd, _ := tensor.NewStateDict(tensor.NewF32("w", 16))
		b, err := safetensors.Encode(sd, map[string]string{"notes": strings.Repeat("x", notes)})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := c.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blob(2 << 20)}); !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), "metadata") {
		t.Fatalf("push with 2 MiB of metadata: %v (want invalid, naming the metadata)", err)
	}
	if _, err := c.Get(ctx, "m", 0); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("pull after the refused push: %v (want not found)", err)
	}
	at := store.MaxMetadataBytes - len("notes")
	if _, err := c.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: blob(at)}); err != nil {
		t.Fatalf("push with metadata at the bound: %v", err)
	}
	snap, err := c.Get(ctx, "m", 0)
	if err != nil || len(snap.Metadata["notes"]) != at {
		t.Fatalf("pull of metadata at the bound: %d bytes of notes, %v", len(snap.Metadata["notes"]), err)
	}
}
