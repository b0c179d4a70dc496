package hub

import (
	"context"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/testkit"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// TestARSWorkerScopedToARun: a worker token scoped to run A's model
// (ars/A) leases only A's tasks while run B has tasks to give (an
// unscoped worker then gets B's), cannot report to, watch or pull the
// policy of B, and no other token can lease, report or detach as its
// worker id.
func TestARSWorkerScopedToARun(t *testing.T) {
	f := newTokenFile(t)
	root := f.add(t, auth.Principal{Name: "root", Role: auth.Admin, Scopes: []string{""}})
	h := startTokenHub(t, f, nil)
	addr := h.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, rconn := dialToken(t, addr, root)
	admin := rlhubv1.NewARSClient(rconn)
	spec := &rlhubv1.ARSRunSpec{Env: "CartPole-v1", Seed: 1, Directions: 4, Top: 2, EvalEvery: 1 << 30, MaxIterations: 1000}
	var runs [2]string
	for i := range runs {
		r, err := admin.StartRun(ctx, &rlhubv1.ARSStartRunRequest{Spec: spec})
		if err != nil {
			t.Fatal(err)
		}
		runs[i] = r.RunId
	}
	// The scoped worker's run is the newer one: leases are handed out
	// oldest run first, so without the scope check it would get B's.
	b, a := runs[0], runs[1]
	scoped := f.add(t, auth.Principal{Name: "worker-a", Role: auth.Worker, Scopes: []string{auth.ARSModelPrefix + a}})
	any := f.add(t, auth.Principal{Name: "worker-any", Role: auth.Worker, Scopes: []string{""}})
	f.write(t)
	h.ReloadAuth()
	testkit.Eventually(t, 10*time.Second, "the new tokens to load", func() bool { return h.cfg.Auth.Len() == 3 })

	_, sconn := dialToken(t, addr, scoped)
	_, aconn := dialToken(t, addr, any)
	sw, aw := rlhubv1.NewARSClient(sconn), rlhubv1.NewARSClient(aconn)
	att, err := sw.Attach(ctx, &rlhubv1.ARSAttachRequest{Name: "scoped"})
	if err != nil {
		t.Fatal(err)
	}
	leases := 0
	for range 20 {
		l, err := sw.Lease(ctx, &rlhubv1.ARSLeaseRequest{WorkerId: att.WorkerId, MaxTasks: 1, WaitMs: 200})
		if err != nil {
			t.Fatalf("scoped lease: %v", err)
		}
		if len(l.Tasks) == 0 {
			break // run A's tasks are all leased out
		}
		if l.RunId != a {
			t.Fatalf("a worker scoped to run %s leased a task of run %s", a, l.RunId)
		}
		leases++
	}
	if leases == 0 {
		t.Fatal("the scoped worker leased nothing of its own run")
	}
	// Run B had tasks all along: an unscoped worker that skips A gets them.
	aatt, err := aw.Attach(ctx, &rlhubv1.ARSAttachRequest{Name: "any"})
	if err != nil {
		t.Fatal(err)
	}
	l, err := aw.Lease(ctx, &rlhubv1.ARSLeaseRequest{WorkerId: aatt.WorkerId, MaxTasks: 1, WaitMs: 2000, SkipRuns: []string{a}})
	if err != nil || l.RunId != b || len(l.Tasks) == 0 {
		t.Fatalf("unscoped worker: lease of run %q (%d tasks), %v; want run %s's", l.GetRunId(), len(l.GetTasks()), err, b)
	}

	denied := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want PermissionDenied", what, err)
		}
	}
	_, err = sw.Report(ctx, &rlhubv1.ARSReportRequest{WorkerId: att.WorkerId, RunId: b, Results: []*rlhubv1.ARSTaskResult{{Task: l.Tasks[0]}}})
	denied("report to run B", err)
	wr, err := sw.WatchRun(ctx, &rlhubv1.ARSWatchRunRequest{RunId: b})
	if err == nil {
		_, err = wr.Recv()
	}
	denied("watch run B", err)
	pp, err := sw.PullPolicy(ctx, &rlhubv1.ARSPullPolicyRequest{RunId: b})
	if err == nil {
		_, err = pp.Recv()
		if err == io.EOF {
			err = nil
		}
	}
	denied("pull run B's policy", err)
	_, err = aw.Lease(ctx, &rlhubv1.ARSLeaseRequest{WorkerId: att.WorkerId, MaxTasks: 1})
	denied("lease as another token's worker", err)
	_, err = aw.Report(ctx, &rlhubv1.ARSReportRequest{WorkerId: att.WorkerId, RunId: b})
	denied("report as another token's worker", err)
	_, err = aw.Detach(ctx, &rlhubv1.ARSDetachRequest{WorkerId: att.WorkerId})
	denied("detach another token's worker", err)
	if _, err := sw.Detach(ctx, &rlhubv1.ARSDetachRequest{WorkerId: att.WorkerId}); err != nil {
		t.Fatalf("its own detach: %v", err)
	}
}
