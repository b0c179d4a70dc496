package rlhub_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/rlhub"
)

// A model deleted and pushed again from version 1 (`rlhub model rm`, then
// a training run restarted under the same name), followed by public
// collectors on a real hub, on each Via (the push stream under its
// Failover, store pull and watch, the data plane and its gRPC fallback).
// By default a collector takes the new model's v1 at once, its weights
// with it; before, it kept the deleted model's v5 until the new model's
// versions passed it. One with NoFollowLives keeps that older rule. The
// collectors are driven by Run, or by Poll alone (poll=true; before, Poll
// followed no lives on any Via; ViaStore's Poll, a pull "if newer", did
// not until storerpc.Client.GetIfNewerLife).
func TestCollectorFollowsAModelDeletedAndPushedAgain(t *testing.T) {
	for _, tc := range []struct {
		via         string
		noDataPlane bool
		poll        bool
	}{{rlhub.ViaPush, false, false}, {rlhub.ViaStore, false, false}, {rlhub.ViaDataPlane, false, false}, {rlhub.ViaDataPlane, true, false},
		{rlhub.ViaPush, false, true}, {rlhub.ViaStore, false, true}, {rlhub.ViaDataPlane, false, true}, {rlhub.ViaDataPlane, true, true}} {
		t.Run(fmt.Sprintf("%s/noDataPlane=%v/poll=%v", tc.via, tc.noDataPlane, tc.poll), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			addr, s := policyHub(t, ctx, tc.noDataPlane)
			for v := uint64(2); v <= 5; v++ {
				if _, err := s.Push(ctx, "policy", v, v-1, weights(float32(v))); err != nil {
					t.Fatal(err)
				}
			}
			start := func(id string, noFollow bool) (*rlhub.Collector, *rlhub.StateDict) {
				local := weights(0)
				c, err := rlhub.NewCollector(ctx, rlhub.CollectorConfig{Hub: addr, Model: "policy", Via: tc.via,
					CollectorID: id, Weights: local, NoFollowLives: noFollow})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				if !tc.poll {
					t.Cleanup(running(ctx, c))
				}
				return c, local
			}
			lives, livesW := start("lives", false)
			older, olderW := start("older", true)
			// poll polls both collectors when they are driven by Poll.
			poll := func() {
				if !tc.poll {
					return
				}
				for _, c := range []*rlhub.Collector{lives, older} {
					if _, err := c.Poll(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			at := func(sd *rlhub.StateDict, want float32) bool {
				w, _ := sd.Get("w").Float32s()
				return w[0] == want && w[1] == -want
			}
			testkit.Eventually(t, 20*time.Second, "both collectors at v5", func() bool {
				poll()
				return lives.Version() == 5 && older.Version() == 5 && at(livesW, 5) && at(olderW, 5)
			})

			del, err := storerpc.NewClient(storerpc.ClientConfig{Addr: addr})
			if err != nil {
				t.Fatal(err)
			}
			defer del.Close()
			if err := del.Delete(ctx, "policy"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Push(ctx, "policy", 1, 0, weights(101)); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, 20*time.Second, "the default collector at the new model's v1", func() bool {
				poll()
				return lives.Version() == 1 && at(livesW, 101)
			})
			if older.Version() != 5 || !at(olderW, 5) {
				w, _ := olderW.Get("w").Float32s()
				t.Fatalf("a NoFollowLives collector runs v%d (weights %v), want the deleted model's v5 (the older rule)", older.Version(), w)
			}
			// Both take the new model's versions past 5.
			for v := uint64(2); v <= 6; v++ {
				if _, err := s.Push(ctx, "policy", v, v-1, weights(100+float32(v))); err != nil {
					t.Fatal(err)
				}
			}
			testkit.Eventually(t, 20*time.Second, "both collectors at the new model's v6", func() bool {
				poll()
				return lives.Version() == 6 && older.Version() == 6 && at(livesW, 106) && at(olderW, 106)
			})
		})
	}
}
