package replica_test

import (
	"testing"

	"github.com/rlhub/rlhub/internal/reduce"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
)

// seedVector pushes version 1 of model, four zeros, through the cluster.
func seedVector(c *testCluster, model string) {
	c.t.Helper()
	sd, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{0, 0, 0, 0}))
	blob, err := safetensors.Encode(sd, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	c.push(model, 1, 0, blob)
}

// appliedOnce is the set of gradients a journal applied; one applied
// twice fails t.
func appliedOnce(t *testing.T, steps []reducer.JournalStep) map[reduce.ID]bool {
	t.Helper()
	applied := map[reduce.ID]bool{}
	for _, s := range steps {
		for _, id := range s.Members {
			if applied[id] {
				t.Errorf("gradient %v applied twice", id)
			}
			applied[id] = true
		}
	}
	return applied
}
