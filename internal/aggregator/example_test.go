package aggregator_test

import (
	"fmt"

	"github.com/rlhub/rlhub/internal/aggregator"
	"github.com/rlhub/rlhub/internal/infoval"
)

// A batch of 10 rows over three learners that each asked for 4: the shares
// are recomputed proportionally and still cover every row once.
func ExampleSplit() {
	shares, err := aggregator.Split(10, []string{"a", "b", "c"}, []int64{4, 4, 4})
	if err != nil {
		panic(err)
	}
	for _, s := range shares {
		fmt.Printf("%s rows [%d,%d)\n", s.Learner, s.Start, s.Start+s.Rows)
	}
	// Output:
	// a rows [0,4)
	// b rows [4,7)
	// c rows [7,10)
}

// DI-engine's rule: scalars become lists, lists concatenate, maps merge
// key by key, homogeneous keys take the first learner's value.
func ExampleMergeInfo() {
	a, _ := infoval.From(map[string]any{"loss": 0.5, "priority": []any{1, 2}, "learner_step": 7, "stats": map[string]any{"n": 4}})
	b, _ := infoval.From(map[string]any{"loss": 0.25, "priority": []any{3}, "learner_step": 8, "stats": map[string]any{"n": 6}})
	merged, err := aggregator.MergeInfo(
		[]aggregator.InfoPart{{Learner: "a", Info: a}, {Learner: "b", Info: b}},
		aggregator.NewMerge(aggregator.RuleDIEngine, aggregator.DefaultHomogeneousKeys))
	if err != nil {
		panic(err)
	}
	m := infoval.To(merged).(map[string]any)
	fmt.Println(m["loss"], m["priority"], m["learner_step"], m["stats"])
	// Output: [0.5 0.25] [1 2 3] 7 map[n:[4 6]]
}
