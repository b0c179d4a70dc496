package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
)

func TestMain(m *testing.M) {
	if os.Getenv("RLHUB_CLUSTER_CHILD") != "" {
		os.Exit(childMember())
	}
	goleak.VerifyTestMain(m,
		// etcd's client keeps a resolver goroutine per process.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}

// freeAddr is a port for an embedded etcd to listen on, or that nothing
// listens on: below the ephemeral range (testkit.FreeAddr), so no
// outgoing connection takes it before etcd binds it.
func freeAddr(t *testing.T) string {
	t.Helper()
	return testkit.FreeAddr(t)
}

func join(t *testing.T, endpoint, cluster, id string, ttl time.Duration) *Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := Join(ctx, Config{Endpoints: []string{endpoint}, Cluster: cluster, ID: id, Addr: "127.0.0.1:" + id,
		LeaseTTL: ttl, Logger: testkit.Logger()})
	if err != nil {
		t.Fatalf("join %s: %v", id, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

type campaignResult struct {
	m    *Member
	term *Term
	err  error
}

func campaignAsync(ctx context.Context, m *Member, out chan<- campaignResult) {
	go func() {
		t, err := m.Campaign(ctx)
		out <- campaignResult{m, t, err}
	}()
}

// TestElectionEpochsGrow: one primary at a time; when it leaves, a standby
// takes over with a larger epoch, and the old term checks as deposed.
func TestElectionEpochsGrow(t *testing.T) {
	e := clustertest.Start(t)
	a := join(t, e.Endpoint, "c1", "a", time.Second)
	b := join(t, e.Endpoint, "c1", "b", time.Second)
	c := join(t, e.Endpoint, "c1", "c", time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan campaignResult, 2)
	standbyCtx, stopStandbys := context.WithCancel(ctx)
	defer stopStandbys()
	campaignAsync(standbyCtx, b, results)
	campaignAsync(standbyCtx, c, results)

	st, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 3 || st.Members[0].ID != "a" || st.Members[2].ID != "c" {
		t.Fatalf("members = %+v, want a, b, c", st.Members)
	}
	if st.Primary == nil || st.Primary.ID != "a" || st.Primary.Epoch != ta.Epoch || st.Primary.Addr != "127.0.0.1:a" {
		t.Fatalf("primary = %+v, want a at epoch %d", st.Primary, ta.Epoch)
	}
	if err := ta.Check(ctx); err != nil {
		t.Fatalf("the primary's own check: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("close a: %v", err)
	}
	next := testkit.Recv(t, results, 30*time.Second, "a standby to be elected")
	if next.err != nil {
		t.Fatal(next.err)
	}
	if next.term.Epoch <= ta.Epoch {
		t.Fatalf("new epoch %d is not above the old %d", next.term.Epoch, ta.Epoch)
	}
	if err := ta.Check(ctx); !errors.Is(err, ErrDeposed) {
		t.Fatalf("the old primary's check = %v, want ErrDeposed", err)
	}
	if err := next.term.Check(ctx); err != nil {
		t.Fatalf("the new primary's check: %v", err)
	}
	l, err := next.m.Leader(ctx)
	if err != nil || l.ID != next.m.ID() || l.Epoch != next.term.Epoch {
		t.Fatalf("Leader = %v, %v; want %s at %d", l, err, next.m.ID(), next.term.Epoch)
	}
	stopStandbys()
	if r := testkit.Recv(t, results, 30*time.Second, "the last standby to stop"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("a standby whose context ended: %v, want context.Canceled", r.err)
	}
}

func TestMemberIDIsTakenWhileItsLeaseLives(t *testing.T) {
	e := clustertest.Start(t)
	join(t, e.Endpoint, "c2", "dup", 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := Join(ctx, Config{Endpoints: []string{e.Endpoint}, Cluster: "c2", ID: "dup", Addr: "x", Logger: testkit.Logger()})
	if !errors.Is(err, errs.ErrExists) {
		t.Fatalf("second member with one id: %v, want ErrExists", err)
	}
}

func TestConfigRejectsNonsense(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no endpoints": {Cluster: "c", Addr: "a"},
		"bad cluster":  {Endpoints: []string{"http://x"}, Cluster: "a/b", Addr: "a"},
		"long id":      {Endpoints: []string{"http://x"}, Cluster: "c", ID: strings.Repeat("i", 65), Addr: "a"},
		"no addr":      {Endpoints: []string{"http://x"}, Cluster: "c"},
		"negative ttl": {Endpoints: []string{"http://x"}, Cluster: "c", Addr: "a", LeaseTTL: -time.Second},
		"ttl of 1.5 s": {Endpoints: []string{"http://x"}, Cluster: "c", Addr: "a", LeaseTTL: 1500 * time.Millisecond},
		"ttl of 0.5 s": {Endpoints: []string{"http://x"}, Cluster: "c", Addr: "a", LeaseTTL: 500 * time.Millisecond},
	} {
		if _, err := Join(context.Background(), cfg); !errors.Is(err, errs.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// childMember is the member process of the fencing test: it joins, wins,
// says so, then checks its term every 50 ms and says when it is deposed.
func childMember() int {
	ep, id := os.Getenv("RLHUB_CLUSTER_ETCD"), os.Getenv("RLHUB_CLUSTER_CHILD")
	ctx := context.Background()
	m, err := Join(ctx, Config{Endpoints: []string{ep}, Cluster: "fence", ID: id, Addr: "127.0.0.1:" + id, LeaseTTL: time.Second, Logger: testkit.Logger()})
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	defer m.Close()
	term, err := m.Campaign(ctx)
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	fmt.Println("elected", term.Epoch)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := term.Check(cctx)
		cancel()
		if errors.Is(err, ErrDeposed) {
			fmt.Println("deposed")
			return 0
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStalledPrimaryIsReplacedAndStepsDown: a primary SIGSTOPped past its
// lease is replaced by a standby with a larger epoch; once it runs again
// it finds itself deposed and steps down by itself. (Its writes meanwhile
// carry the older epoch, which the store refuses once it has seen the
// newer one.)
func TestStalledPrimaryIsReplacedAndStepsDown(t *testing.T) {
	e := clustertest.Start(t)
	child := testkit.StartProc(t, testkit.ProcConfig{Name: "member old", Path: os.Args[0], Args: []string{"-test.run", "^$"},
		Env: []string{"RLHUB_CLUSTER_CHILD=old", "RLHUB_CLUSTER_ETCD=" + e.Endpoint}})
	// line waits for the child's n-th line of output.
	line := func(n int, what string) string {
		t.Helper()
		var l string
		testkit.Eventually(t, 30*time.Second, what, func() bool {
			lines := strings.SplitAfter(child.Output(), "\n")
			if len(lines) <= n || !strings.HasSuffix(lines[n], "\n") {
				return false
			}
			l = strings.TrimSuffix(lines[n], "\n")
			return true
		})
		return l
	}
	first := line(0, "the child to be elected")
	oldEpoch, err := strconv.ParseUint(strings.TrimPrefix(first, "elected "), 10, 64)
	if err != nil {
		t.Fatalf("child said %q", first)
	}
	child.Signal(t, syscall.SIGSTOP)
	standby := join(t, e.Endpoint, "fence", "new", time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	term, err := standby.Campaign(ctx) // returns once the stopped child's lease lapses
	if err != nil {
		t.Fatal(err) // the child is continued and killed at cleanup
	}
	if term.Epoch <= oldEpoch {
		t.Fatalf("new primary's epoch %d is not above the stalled one's %d", term.Epoch, oldEpoch)
	}
	child.Signal(t, syscall.SIGCONT)
	if got := line(1, "the resumed child to find itself deposed"); got != "deposed" {
		t.Fatalf("resumed child said %q, want deposed", got)
	}
	if err := term.Check(ctx); err != nil {
		t.Fatalf("the new primary lost its term to a resumed old one: %v", err)
	}
}

// TestEtcdRestartPausesThenResumes: while etcd is down reads fail with
// Unavailable and the primary's check says do not write; after etcd comes
// back on its data the same primary holds the same term — no second
// primary appeared.
func TestEtcdRestartPausesThenResumes(t *testing.T) {
	e := clustertest.Start(t)
	a := join(t, e.Endpoint, "c3", "a", 5*time.Second)
	b := join(t, e.Endpoint, "c3", "b", 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan campaignResult, 1)
	bctx, stopB := context.WithCancel(ctx)
	defer stopB()
	campaignAsync(bctx, b, results)

	e.Kill()
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	_, err = Read(short, Config{Endpoints: []string{e.Endpoint}, Cluster: "c3", DialTimeout: time.Second})
	cerr := ta.Check(short)
	cancelShort()
	if !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("status with etcd down: %v, want ErrUnavailable", err)
	}
	if cerr == nil {
		t.Fatal("the primary's check passed with etcd down: it would write unfenced")
	}
	e.Restart()
	testkit.Eventually(t, 30*time.Second, "the primary's check to pass again", func() bool {
		c, cc := context.WithTimeout(ctx, 2*time.Second)
		defer cc()
		return ta.Check(c) == nil
	})
	st, err := b.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Primary == nil || st.Primary.ID != "a" || st.Primary.Epoch != ta.Epoch {
		t.Fatalf("after etcd's restart the primary is %+v, want a at %d", st.Primary, ta.Epoch)
	}
	// A standby's campaign may fail while etcd is down (it campaigns
	// again); it must never have won.
	select {
	case r := <-results:
		if r.term != nil {
			t.Fatalf("the standby was elected (epoch %d) while the primary still held its term", r.term.Epoch)
		}
		if !errors.Is(r.err, errs.ErrUnavailable) && !errors.Is(r.err, ErrDeposed) {
			t.Fatalf("the standby's campaign ended with %v, want Unavailable while etcd was down", r.err)
		}
	default:
		stopB()
		testkit.Recv(t, results, 30*time.Second, "the standby to stop")
	}
}

func TestEmbeddedSingleNode(t *testing.T) {
	emb, err := StartEmbedded(EmbeddedConfig{Dir: t.TempDir(), ClientURL: "http://" + freeAddr(t), PeerURL: "http://" + freeAddr(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer emb.Close()
	m := join(t, emb.Endpoint(), "emb", "solo", time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	term, err := m.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Read(ctx, Config{Endpoints: []string{emb.Endpoint()}, Cluster: "emb"})
	if err != nil || st.Primary == nil || st.Primary.Epoch != term.Epoch || len(st.Members) != 1 {
		t.Fatalf("status = %+v, %v", st, err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

// ProofEnded is open while the last renewal of the term proof succeeded,
// closed by one that failed for want of etcd (here etcd stopped: it
// answers nothing), not by one its caller gave up (cancelled), and
// replaced by an open channel at the next renewal that succeeds.
func TestProofEndedFollowsTheRenewals(t *testing.T) {
	e := clustertest.Start(t)
	m := join(t, e.Endpoint, "proofended", "p", 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	term, err := m.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	if err := term.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	first := term.ProofEnded()
	if closed(first) {
		t.Fatal("ProofEnded is closed after a renewal that succeeded")
	}
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if err := term.Renew(cctx); err == nil {
		t.Fatal("a renewal with its context cancelled succeeded")
	}
	if closed(term.ProofEnded()) {
		t.Fatal("ProofEnded closed by a renewal its caller cancelled")
	}

	e.Stop()
	short, scancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err = term.Renew(short)
	scancel()
	e.Cont()
	if err == nil {
		t.Fatal("a renewal with etcd stopped succeeded")
	}
	if !closed(first) || !closed(term.ProofEnded()) {
		t.Fatal("ProofEnded still open after a renewal etcd did not answer")
	}
	if term.Valid() == nil {
		t.Fatal("the proof holds after a failed renewal")
	}

	testkit.Eventually(t, 30*time.Second, "a renewal to succeed again", func() bool {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		defer rcancel()
		return term.Renew(rctx) == nil
	})
	if closed(term.ProofEnded()) {
		t.Fatal("ProofEnded still closed after a renewal succeeded again")
	}
	if !closed(first) {
		t.Fatal("the channel a waiter took before the failure reopened")
	}
}

// TestJoinWithoutEtcdEnds: a hub joining (or rejoining, its lease lost)
// while no etcd answers must neither wait for etcd forever nor ignore its
// own shutdown. etcd's client waits for a connection ready (WaitForReady)
// and the session's context never ends, so the lease grant once hung
// until etcd came back, and SIGTERM could not stop the hub meanwhile.
func TestJoinWithoutEtcdEnds(t *testing.T) {
	dead := freeAddr(t) // nothing listens there
	cfg := Config{Endpoints: []string{dead}, Cluster: "c1", ID: "a", Addr: "127.0.0.1:1",
		LeaseTTL: time.Second, DialTimeout: 300 * time.Millisecond, Logger: testkit.Logger()}
	deadline := func(d time.Duration) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		t.Cleanup(cancel)
		return ctx
	}
	joined := func(ctx context.Context) <-chan error {
		out := make(chan error, 1)
		go func() {
			m, err := Join(ctx, cfg)
			if err == nil {
				m.Close()
				err = errors.New("joined a cluster whose etcd is not there")
			}
			out <- err
		}()
		return out
	}
	// The caller's deadline passes.
	select {
	case err := <-joined(deadline(time.Second)):
		if !errors.Is(err, errs.ErrUnavailable) {
			t.Fatalf("join without etcd: %v, want unavailable", err)
		}
		t.Logf("join without etcd: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("join without etcd did not end at its deadline")
	}
	// The caller cancels (the hub's SIGTERM).
	ctx, cancel := context.WithCancel(context.Background())
	out := joined(ctx)
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case err := <-out:
		if err == nil {
			t.Fatal("canceled join returned no error")
		}
	case <-time.After(time.Minute):
		t.Fatal("canceled join did not end")
	}
}
