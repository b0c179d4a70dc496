package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
)

// An election record is read from etcd as it is: one that is not a
// member's, or whose address no hub could name (over NamesPrimary's
// bound, white space: the bound a refusal's address is held to), names
// no primary — Read's status shows none and Reader.Leader says
// ErrNoLeader — rather than handing a client a 200 kB address to dial
// and quote. Python's _leader_of holds the record to the same bound.
func TestElectionRecordNamingNoAddressNamesNoPrimary(t *testing.T) {
	e := clustertest.Start(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	record := func(addr any) string {
		b, err := json.Marshal(map[string]any{"id": "h1", "addr": addr})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for name, value := range map[string]string{
		"long":  record(strings.Repeat("h", 200_000) + ":7470"),
		"space": record("127.0.0.1:7470 and more"),
		"empty": record(""),
		"good":  record("127.0.0.1:7470"), // the control: a record a hub writes names it
	} {
		t.Run(name, func(t *testing.T) {
			cfg := Config{Endpoints: []string{e.Endpoint}, Cluster: "rec-" + name}
			lease, err := cli.Grant(ctx, 300)
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Revoke(context.Background(), lease.ID)
			key := fmt.Sprintf("%s%x", cfg.electionPrefix(), lease.ID) // as concurrency.Election names its key
			if _, err := cli.Put(ctx, key, value, clientv3.WithLease(lease.ID)); err != nil {
				t.Fatal(err)
			}
			st, err := Read(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			r, err := OpenReader(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			l, lerr := r.Leader(ctx)
			if name == "good" {
				if st.Primary == nil || st.Primary.Addr != "127.0.0.1:7470" || lerr != nil || l.Addr != "127.0.0.1:7470" {
					t.Fatalf("a member's record: status primary %+v, leader %+v (%v); want 127.0.0.1:7470", st.Primary, l, lerr)
				}
				return
			}
			if st.Primary != nil {
				t.Fatalf("status names primary %.80q from a record no hub writes", st.Primary.Addr)
			}
			if !errors.Is(lerr, ErrNoLeader) {
				t.Fatalf("Leader: %+v, %v; want ErrNoLeader", l, lerr)
			}
		})
	}
}
