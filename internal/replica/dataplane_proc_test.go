package replica_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
)

// Between `rlhub serve --etcd` processes the standby follows on the data
// plane by default and on gRPC with --replica-transport grpc; either way
// every acknowledged version is on the standby's disk byte for byte.
func TestClusterReplicatesOnTheDataPlane(t *testing.T) {
	e := clustertest.Start(t)
	for _, tc := range []struct{ transport, logged string }{
		{"auto", `transport="data plane"`},
		{"grpc", `transport=gRPC`},
	} {
		t.Run(tc.transport, func(t *testing.T) {
			c := newCluster(t, e.Endpoint, 2, "--replica-transport", tc.transport)
			l, p := c.leader(0)
			s := c.standbys(p)[0]
			c.synced(s, l)
			for v := uint64(1); v <= 3; v++ {
				blob := storetest.Blob(t, v, int(v)<<18+int(v)) // ~1, 2, 3 MiB
				c.push("pol", v, v-1, blob)                     // acks all: on the standby when it returns
				got, err := os.ReadFile(filepath.Join(s.data, "store", store.VersionFile("pol", v)))
				if err != nil {
					t.Fatalf("the standby's copy of v%d: %v", v, err)
				}
				if !bytes.Equal(got, blob) {
					t.Fatalf("the standby's v%d: %d bytes, not the %d pushed (or different bytes)", v, len(got), len(blob))
				}
			}
			if out := s.out.String(); !strings.Contains(out, tc.logged) {
				t.Fatalf("the standby did not log %s:\n%s", tc.logged, out)
			}
		})
	}
}
