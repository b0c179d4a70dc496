package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestTLSEtcdWithItsFirstMemberStopped: a 3-member etcd over TLS (the
// documented production shape) whose first member is SIGSTOPped (a hung
// machine whose kernel still accepts connections); members 2 and 3 form
// a quorum. A Read (cluster status, every client's lookups), OpenReader
// and a hub's Join given all three endpoints must work. The TLS check
// before dialling took the first member's handshake timeout for a TLS
// problem and tried no other endpoint: every Join, OpenReader and Read
// failed for as long as that member stayed stopped.
func TestTLSEtcdWithItsFirstMemberStopped(t *testing.T) {
	es, caPath := clustertest.StartTLSCluster(t, 3)
	eps := clustertest.Endpoints(es)
	cfg := Config{Endpoints: eps, Cluster: "c", DialTimeout: 2 * time.Second, Security: EtcdSecurity{CACert: caPath}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := Read(ctx, cfg); err != nil {
		t.Fatalf("control read: %v", err)
	}
	es[0].Stop()
	defer es[0].Cont()
	if _, err := Read(ctx, Config{Endpoints: eps[1:], Cluster: "c", DialTimeout: 2 * time.Second, Security: cfg.Security}); err != nil {
		t.Fatalf("read through members 2 and 3 only: %v", err)
	}
	if _, err := Read(ctx, cfg); err != nil {
		t.Errorf("Read given all three endpoints, the first stopped: %v", err)
	}
	if r, err := OpenReader(cfg); err != nil {
		t.Errorf("OpenReader given all three endpoints, the first stopped: %v", err)
	} else {
		r.Close()
	}
	jcfg := cfg
	jcfg.ID, jcfg.Addr, jcfg.LeaseTTL, jcfg.Logger = "h1", "127.0.0.1:1", 2*time.Second, testkit.Logger()
	if m, err := Join(ctx, jcfg); err != nil {
		t.Errorf("Join given all three endpoints, the first stopped: %v", err)
	} else {
		m.Close()
	}
}
