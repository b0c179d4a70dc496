package aggregator

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
)

// StatsToProto and StatsFromProto carry the same numbers both ways.
func TestStatsProtoRoundTrip(t *testing.T) {
	st := Stats{TaskID: "t1", Attached: 3, Removed: 1, LearnOK: 7, LearnFailed: 2, Resplits: 1,
		Learners: []LearnerStats{{ID: "a", Resources: map[string]string{"gpu": "1"}, LeaseLeft: 1500 * time.Millisecond, StartedTask: "t1", TasksDone: 4, TasksFailed: 1}}}
	p := StatsToProto(st)
	back := StatsFromProto(p)
	if !proto.Equal(StatsToProto(back), p) || back.Learners[0].LeaseLeft != st.Learners[0].LeaseLeft || back.Learners[0].Resources["gpu"] != "1" {
		t.Fatalf("round trip: %+v -> %+v", st, back)
	}
}
