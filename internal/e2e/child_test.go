package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/reducer"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync"
	"github.com/rlhub/rlhub/rlhub"
)

// childEnv makes this test binary a child process (TestMain): a learner
// or a collector that runs on a lab host (Host.Start), where its hostname
// and its loopback are that host's, and says what it did on stdout.
const childEnv = "RLHUB_E2E_CHILD"

// childFlags are what every child is given: the cluster (etcd://…) and
// the files a client of the deployment holds.
type childFlags struct {
	target, model, id            string
	ca, cert, key, token, stopAt string
}

func parseChild(args []string) (*childFlags, *flag.FlagSet) {
	f := &childFlags{}
	fs := flag.NewFlagSet(args[0], flag.ExitOnError)
	fs.StringVar(&f.target, "target", "", "etcd://E/NAME")
	fs.StringVar(&f.model, "model", "", "model")
	fs.StringVar(&f.id, "id", "", "client or collector id")
	fs.StringVar(&f.ca, "ca", "", "CA file")
	fs.StringVar(&f.cert, "cert", "", "client certificate")
	fs.StringVar(&f.key, "key", "", "its key")
	fs.StringVar(&f.token, "token", "", "token file")
	fs.StringVar(&f.stopAt, "stop", "", "stop once this file exists")
	return f, fs
}

// dialConfig is the client side of the deployment: mutual TLS, the
// token, and plaintext etcd off loopback allowed (the lab's etcd).
func (f *childFlags) dialConfig() (dial.Config, error) {
	dc, err := dial.Files{CA: f.ca, Cert: f.cert, Key: f.key, TokenFile: f.token}.Load()
	dc.Etcd = cluster.EtcdSecurity{Insecure: true}
	return dc, err
}

func (f *childFlags) stopped() bool {
	_, err := os.Stat(f.stopAt)
	return err == nil
}

func childMain(args []string) int {
	if len(args) == 0 {
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	var err error
	switch args[0] {
	case "learner":
		err = learnerMain(ctx, args)
	case "collector-push":
		err = pushCollectorMain(ctx, args)
	case "collector-shm":
		err = shmCollectorMain(ctx, args)
	default:
		err = fmt.Errorf("unknown child %q", args[0])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// learnerMain is a trainer's loop: pull the newest version, push one
// gradient on it, until the stop file appears; then it prints
// "summary pushes=N ok=… exists=… unknown=… failed=…". Every push has
// exactly one outcome.
func learnerMain(ctx context.Context, args []string) error {
	f, fs := parseChild(args)
	_ = fs.Parse(args[1:])
	dc, err := f.dialConfig()
	if err != nil {
		return err
	}
	sc, err := storerpc.NewClient(storerpc.ClientConfig{Addr: f.target, Dial: dc, CallTimeout: 30 * time.Second, MaxAttempts: 20, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		return err
	}
	defer sc.Close()
	rc, err := reducer.NewClient(reducer.ClientConfig{Hub: f.target, Dial: dc, ClientID: f.id, ReconnectWindow: time.Minute})
	if err != nil {
		return err
	}
	defer rc.Close()
	grad, _ := tensor.NewStateDict(tensor.FromFloat32s("w", []int64{4}, []float32{1, 1, 1, 1}))
	var pushes, ok, exists, unknown, failed int
	for !f.stopped() && ctx.Err() == nil {
		var snap *store.Snapshot
		for try := 0; ; try++ {
			pctx, cancel := context.WithTimeout(ctx, time.Minute)
			snap, err = sc.Get(pctx, f.model, 0)
			cancel()
			if err == nil || !errors.Is(err, errs.ErrUnavailable) || try == 100 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("pull: %w", err)
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		began := time.Now()
		r, err := rc.PushGrad(pctx, f.model, snap.Version, grad)
		cancel()
		pushes++
		if took := time.Since(began); took > 2*time.Second { // for the log: where a machine's death was felt
			fmt.Printf("push %d on v%d took %v (at %s): %v\n", pushes, snap.Version, took.Round(time.Millisecond), r.Addr, err)
		}
		switch {
		case err == nil:
			ok++
		case errors.Is(err, errs.ErrExists):
			exists++
		case errors.Is(err, reducer.ErrOutcomeUnknown):
			unknown++
		default:
			failed++
			fmt.Printf("push %d on v%d: %v\n", pushes, snap.Version, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Printf("summary pushes=%d ok=%d exists=%d unknown=%d failed=%d\n", pushes, ok, exists, unknown, failed)
	return nil
}

// reportVersions prints "applied v=V epoch=E via=T at=UNIXNANO" each time version()
// moves, until ctx ends or the stop file appears.
func reportVersions(ctx context.Context, f *childFlags, current func() (uint64, uint64, string)) {
	var last uint64
	for ctx.Err() == nil && !f.stopped() {
		if v, epoch, via := current(); v != last {
			fmt.Printf("applied v=%d epoch=%d via=%s at=%d\n", v, epoch, via, time.Now().UnixNano())
			last = v
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pushCollectorMain is a collector on the public Go package, given only
// the cluster: rlhub.Collector ViaPush on etcd://, which prefers the relay
// announced for the model on this host and follows the primary without
// one.
func pushCollectorMain(ctx context.Context, args []string) error {
	f, fs := parseChild(args)
	_ = fs.Parse(args[1:])
	// As a program on the public package is configured: from the
	// RLHUB_TLS_*, RLHUB_TOKEN_FILE and RLHUB_ETCD_* environment.
	sec, err := rlhub.SecurityFromEnv()
	if err != nil {
		return err
	}
	nctx, cancel := context.WithTimeout(ctx, time.Minute)
	c, err := rlhub.NewCollector(nctx, rlhub.CollectorConfig{Hub: f.target, Model: f.model, CollectorID: f.id, Security: sec})
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("collector up")
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	reportVersions(ctx, f, func() (uint64, uint64, string) {
		s := c.Current()
		if s == nil {
			return 0, 0, c.Transport()
		}
		return s.Version, s.Epoch, c.Transport()
	})
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// shmCollectorMain reads the shared-memory segment of the relay announced
// for the model on this host (its announcement names the segment).
func shmCollectorMain(ctx context.Context, args []string) error {
	f, fs := parseChild(args)
	_ = fs.Parse(args[1:])
	dc, err := f.dialConfig()
	if err != nil {
		return err
	}
	t, err := dial.ParseTarget(f.target)
	if err != nil {
		return err
	}
	r, err := cluster.OpenReader(cluster.Config{Endpoints: t.Etcd, Cluster: t.Cluster, DialTimeout: 5 * time.Second, Security: dc.Etcd})
	if err != nil {
		return err
	}
	var relay cluster.ServiceInfo
	for {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, found, err := r.LocalRelay(lctx, f.model, "")
		cancel()
		if err == nil && found && s.Shm != "" {
			relay = s
			break
		}
		if ctx.Err() != nil {
			r.Close()
			return ctx.Err()
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.Close()
	fo, err := wsync.NewFailover(wsync.FailoverConfig{Logger: testkit.Logger(), Backoff: 20 * time.Millisecond,
		Dialers: []wsync.Dialer{wsync.ShmDialer("relay-shm", relay.Shm, f.model)}})
	if err != nil {
		return err
	}
	defer fo.Close()
	recv, err := wsync.NewReceiver(wsync.ReceiverConfig{Source: fo})
	if err != nil {
		return err
	}
	fmt.Printf("collector up on %s\n", relay.Shm)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- recv.Run(rctx) }()
	reportVersions(ctx, f, func() (uint64, uint64, string) {
		s := recv.Current()
		if s == nil {
			return 0, 0, "shm"
		}
		return s.Version, s.Epoch, "shm"
	})
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
