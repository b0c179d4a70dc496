package rlhub_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/rlhub"
)

// startHub runs an in-memory hub on a free loopback port, as `rlhub serve`
// would, and returns its address and a stop function. (A program outside
// this module would start the binary instead; the client is the same.)
func startHub() (string, func()) {
	h, err := hub.New(hub.Config{Listen: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Reducer: reducer.Config{BatchSize: 1}})
	if err != nil {
		log.Fatal(err)
	}
	if err := h.Start(); err != nil {
		log.Fatal(err)
	}
	return h.Addr().String(), func() { h.Close() }
}

func weights(v float32) *rlhub.StateDict {
	sd, err := rlhub.NewStateDict(rlhub.FromFloat32s("w", []int64{2}, []float32{v, -v}))
	if err != nil {
		log.Fatal(err)
	}
	return sd
}

func ExampleStoreClient() {
	addr, stop := startHub()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: addr})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Push(ctx, "policy", 1, 0, weights(1)); err != nil {
		log.Fatal(err)
	}
	// A second writer that believes version 0 is current loses.
	_, err = s.Push(ctx, "policy", 2, 0, weights(2))
	fmt.Println("stale push refused:", errors.Is(err, rlhub.ErrStaleVersion))
	snap, err := s.Pull(ctx, "policy", 0)
	if err != nil {
		log.Fatal(err)
	}
	w, _ := snap.Tensors.Get("w").Float32s()
	fmt.Println("version", snap.Version, "w", w)
	none, _ := s.PullIfNewer(ctx, "policy", 1)
	fmt.Println("newer than 1:", none != nil)
	// Output:
	// stale push refused: true
	// version 1 w [1 -1]
	// newer than 1: false
}

func ExampleCollector() {
	addr, stop := startHub()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: addr})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Push(ctx, "policy", 1, 0, weights(1)); err != nil {
		log.Fatal(err)
	}

	local := weights(0) // the collector's own weights, updated in place
	for _, via := range []string{rlhub.ViaStore, rlhub.ViaPush} {
		c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: addr, Model: "policy", Via: via,
			CollectorID: "go-" + via, Weights: local})
		if err != nil {
			log.Fatal(err)
		}
		for c.Version() < 1 { // the push stream delivers asynchronously
			if _, err := c.Poll(ctx); err != nil {
				log.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
		w, _ := local.Get("w").Float32s()
		fmt.Println(via, "runs version", c.Version(), "w", w)
		c.Close()
		if via == rlhub.ViaStore { // a new version for the next collector
			if _, err := s.Push(ctx, "policy", 2, 1, weights(2)); err != nil {
				log.Fatal(err)
			}
		}
	}
	// Output:
	// store runs version 1 w [1 -1]
	// push runs version 2 w [2 -2]
}

func ExampleGradClient() {
	addr, stop := startHub()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := rlhub.DialStore(rlhub.StoreConfig{Addr: addr})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Push(ctx, "policy", 1, 0, weights(1)); err != nil {
		log.Fatal(err)
	}

	g, err := rlhub.DialGrads(rlhub.GradConfig{Hub: addr, ClientID: "trainer-0"})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	// The hub runs the optimizer: plain SGD, learning rate 0.5.
	if _, _, err := g.RegisterModel(ctx, rlhub.ModelTraining{Model: "policy",
		Optimizer: rlhub.Optimizer{Kind: rlhub.SGD, LR: 0.5}}); err != nil {
		log.Fatal(err)
	}
	r, err := g.Push(ctx, "policy", 1, weights(1)) // gradient [1, -1] on version 1
	if err != nil {
		log.Fatal(err)
	}
	next, err := s.WaitNewer(ctx, "policy", 1)
	if err != nil {
		log.Fatal(err)
	}
	w, _ := next.Tensors.Get("w").Float32s()
	fmt.Println("admitted at", r.Version, "seq", r.Seq, "-> version", next.Version, "w", w)
	// Output:
	// admitted at 1 seq 1 -> version 2 w [0.5 -0.5]
}
