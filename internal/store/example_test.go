package store_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
)

// A writer publishes versions with compare-and-set; a stale writer learns
// the current version from the error; readers share the stored snapshot.
func Example() {
	ctx := context.Background()
	s, _ := store.NewMemory(store.Config{})
	defer s.Close()

	sd, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{2}, []float32{0.5, -1}))
	blob, _ := safetensors.Encode(sd, nil)

	info, _ := s.Push(ctx, store.PushRequest{Name: "policy", Version: 1, Expect: 0, Blob: blob})
	fmt.Println("pushed version", info.Version)

	// A second writer still believes the model does not exist.
	_, err := s.Push(ctx, store.PushRequest{Name: "policy", Version: 1, Expect: 0, Blob: blob})
	var stale *errs.StaleError
	if errors.As(err, &stale) {
		fmt.Println("refused; current version is", stale.CurrentVersion)
	}

	snap, _ := s.Get(ctx, "policy", 0)
	w, _ := snap.Tensors.Get("w").Float32s()
	fmt.Println("newest", snap.Version, w)
	// Output:
	// pushed version 1
	// refused; current version is 1
	// newest 1 [0.5 -1]
}
