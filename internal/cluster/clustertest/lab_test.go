package clustertest

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rlhub/rlhub/internal/testkit"
)

// A three-member etcd across three lab hosts keeps serving with one host
// cut off, and the cut-off member refuses linearizable reads (it is in
// the minority) until it is healed.
func TestEtcdOnLabKeepsQuorumWithoutOneHost(t *testing.T) {
	lab := testkit.NewLab(t, "m1", "m2", "m3")
	e := StartOnLab(t, lab.Hosts)
	if got := len(strings.Split(e.Endpoints, ",")); got != 3 {
		t.Fatalf("Endpoints %q", e.Endpoints)
	}
	put := func(endpoint, key string) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = cli.Put(ctx, key, "v")
		return err
	}
	if err := put(lab.Hosts[0].IP+":2379", "before"); err != nil {
		t.Fatal(err)
	}
	lab.Hosts[0].Cut(t)
	// If m1 led, m2 and m3 elect a leader after their election timeout.
	testkit.Eventually(t, 30*time.Second, "the majority side to take a write with m1 cut off", func() bool {
		return put(lab.Hosts[1].IP+":2379", "during") == nil
	})
	if err := put(lab.Hosts[0].IP+":2379", "cut"); err == nil {
		t.Fatal("m1, cut off from the others, took a write")
	}
	lab.Hosts[0].Heal(t)
	testkit.Eventually(t, 30*time.Second, "m1 to serve again", func() bool { return put(lab.Hosts[0].IP+":2379", "after") == nil })
}
