package arsrpc

import (
	"context"
	"testing"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
	pb "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// TestPersisterNamesEveryFileItWrites: with a StateChanged, the service
// names each run's progress.log and state.json once written, before the
// push of the policy version they belong to, and a restart's rewrite of
// the log too.
func TestPersisterNamesEveryFileItWrites(t *testing.T) {
	dir := t.TempDir()
	names := testkit.NewStateNames(t, dir)
	mem, _ := store.NewMemory(store.Config{})
	st := storetest.BeforePush{Store: mem, Check: names.Check}
	open := func() *Service {
		s, err := New(Config{Store: st, DataDir: dir, Logger: testkit.Logger(), StateChanged: names.Changed})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	start, err := s.StartRun(context.Background(), &pb.ARSStartRunRequest{Spec: persistSpec()})
	if err != nil {
		t.Fatal(err)
	}
	names.Check("after StartRun")
	drive(t, s, start.RunId, 3)
	s.Close()
	names.Check("after 3 iterations")
	s = open() // restores the run: progress.log rewritten
	defer s.Close()
	names.Check("after the restart")
	drive(t, s, start.RunId, 2)
	names.Check("after 2 more iterations")
	if got := names.Checks(); got < 8 {
		t.Fatalf("%d checks, want one per push at least", got)
	}
}
