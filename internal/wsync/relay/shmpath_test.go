//go:build linux

package relay

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wsync"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// Two relays on one host whose segments go to the same path (models
// "team/policy" and "team_policy" share the default /dev/shm/rlhub-team_policy):
// the one that comes second never takes the live one's segment from it,
// whether its first version lands after the other made its segment or it
// starts after that (it is refused, naming the segment's model).
func TestRelayNeverTakesALiveRelaysSegment(t *testing.T) {
	if wsync.DefaultShmPath("team/policy") != wsync.DefaultShmPath("team_policy") {
		t.Fatal("the two models' default segments differ; this test needs them to collide")
	}
	h := startHub(t)
	push := func(model string, v uint64) {
		snap := wsynctest.Snap(t, model, v, 1000)
		if _, err := h.st.Push(context.Background(), store.PushRequest{Name: model, Version: v, Expect: store.ExpectAny, Blob: snap.Blob}); err != nil {
			t.Fatal(err)
		}
	}
	path := wsynctest.ShmPath(t)
	// The second model's relay starts first; its model has no version yet.
	second := runRelay(t, Config{Upstream: dial(t, h.addr), Model: "team_policy", ID: "relay-b", ShmPath: path, Logger: quiet()})
	push("team/policy", 1)
	runRelay(t, Config{Upstream: dial(t, h.addr), Model: "team/policy", ID: "relay-a", ShmPath: path, Logger: quiet()})
	waitSegment(t, path, 1)
	push("team_policy", 1)
	waitFor(t, "the second relay at v1", func() bool { return second.Newest() == 1 })
	time.Sleep(100 * time.Millisecond) // its segment, if it made one, is made by now

	r, err := shm.Open(shm.ReaderConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Name() != "team/policy" {
		t.Fatalf("segment at %s holds model %q: the team_policy relay took the live team/policy relay's segment", path, r.Name())
	}

	_, err = New(Config{Upstream: dial(t, h.addr), Model: "team_policy", ID: "relay-c", ShmPath: path, Logger: quiet()})
	if !errors.Is(err, errs.ErrExists) {
		t.Fatalf("a relay started on a live relay's segment: %v; want ErrExists", err)
	}
}

// A FIFO at a relay's segment path is a file that is no segment: the
// relay starts at once (it waited in open(2) for a writer, for ever) and
// puts its segment there at its first version.
func TestRelayStartsOverAFIFOAtItsSegmentPath(t *testing.T) {
	h := startHub(t)
	path := wsynctest.ShmPath(t)
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Upstream: dial(t, h.addr), Model: "m", ID: "relay-fifo", ShmPath: path, Logger: quiet()}
	started := make(chan error, 1)
	go func() {
		_, err := New(cfg)
		started <- err
	}()
	select {
	case err := <-started:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		if f, err := os.OpenFile(path, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			f.Close() // a writer's open ends the wait
		}
		<-started
		t.Fatal("relay New still waiting on the FIFO at its segment path after 10 s")
	}
	runRelay(t, cfg)
	snap := wsynctest.Snap(t, "m", 1, 1000)
	if _, err := h.st.Push(context.Background(), store.PushRequest{Name: "m", Version: 1, Expect: store.ExpectAny, Blob: snap.Blob}); err != nil {
		t.Fatal(err)
	}
	waitSegment(t, path, 1)
}
