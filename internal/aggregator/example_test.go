package aggregator_test

import (
	"fmt"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rlhub/rlhub/internal/aggregator"
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

// Lists concatenate, scalars become lists, homogeneous keys stay single.
func ExampleMergeInfo() {
	a, _ := structpb.NewStruct(map[string]any{"loss": 0.5, "priority": []any{1, 2}, "learner_step": 7})
	b, _ := structpb.NewStruct(map[string]any{"loss": 0.25, "priority": []any{3}, "learner_step": 7})
	merged, err := aggregator.MergeInfo(
		[]aggregator.InfoPart{{Learner: "a", Info: a}, {Learner: "b", Info: b}},
		map[string]bool{"learner_step": true})
	if err != nil {
		panic(err)
	}
	m := merged.AsMap()
	fmt.Println(m["loss"], m["priority"], m["learner_step"])
	// Output: [0.5 0.25] [1 2 3] 7
}
