package replica

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A follower of an older build (its hello names no Dirs) mirrors
// legacyDirs and fails a unit naming any other path, so the primary
// leaves the aggregator's state out of its stream, in a full sync and in
// the units after it, while a follower of this build gets it. Both
// streams carry the store's versions whole. The follower is the test,
// speaking the stream, with and without the replication codec.
func TestLegacyFollowerGetsOnlyItsDirs(t *testing.T) {
	for _, codec := range []bool{false, true} {
		t.Run(map[bool]string{false: "grpc", true: "codec"}[codec], func(t *testing.T) { testLegacyFollower(t, codec) })
	}
}

func testLegacyFollower(t *testing.T, codec bool) {
	dir := t.TempDir()
	st, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(dir, "store"), Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	src, err := NewSource(SourceConfig{DataDir: dir, Epoch: 5, Acks: 0, Logger: testkit.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ServeGRPC(t, nil, src.Register)
	defer src.Close()
	fenced := &Fenced{Store: st, Epoch: 5, Source: src}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	task := filepath.Join(dir, "aggregator", "task.json")
	writeTask := func(body string) {
		t.Helper()
		err := fenced.WriteState(ctx, func() error {
			if err := os.MkdirAll(filepath.Dir(task), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(task, []byte(body), 0o644); err != nil {
				return err
			}
			src.Changed(task)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	blobs := map[uint64][]byte{}
	push := func(v uint64) {
		t.Helper()
		blobs[v] = storetest.Blob(t, v, 1<<16)
		if _, err := fenced.Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: bytes.Clone(blobs[v])}); err != nil {
			t.Fatal(err)
		}
	}
	push(1)
	writeTask(`{"id":"t1"}`)

	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	var opts []grpc.CallOption
	if codec {
		opts = append(opts, grpc.CallContentSubtype(codecName))
	}
	// follow opens a stream with h and returns its unit reader: each call
	// reads one unit and returns the paths it named (F, K or X) and the
	// files' bytes.
	follow := func(h hello) func() ([]string, map[string][]byte) {
		cs, err := cc.NewStream(ctx, &streamDesc, FollowMethod, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := cs.SendMsg(jsonFrame(kindHello, h)); err != nil {
			t.Fatal(err)
		}
		return func() ([]string, map[string][]byte) { return readFollowUnit(t, cs) }
	}
	legacy := follow(hello{Member: "old", Epoch: 5})
	current := follow(hello{Member: "new", Epoch: 5, Dirs: mirroredDirs})
	v1 := filepath.Join("store", store.VersionFile("m", 1))
	taskRel := filepath.Join("aggregator", "task.json")

	paths, files := legacy()
	if strings.Contains(strings.Join(paths, "\n"), "aggregator") || !bytes.Equal(files[v1], blobs[1]) {
		t.Fatalf("legacy follower's full sync: paths %q, version 1 intact %v; want no aggregator path", paths, bytes.Equal(files[v1], blobs[1]))
	}
	paths, files = current()
	if string(files[taskRel]) != `{"id":"t1"}` || !bytes.Equal(files[v1], blobs[1]) {
		t.Fatalf("current follower's full sync: paths %q, task %q", paths, files[taskRel])
	}

	// A unit with both a version and the task: each follower reads it
	// whole (the next frame after it must be the next unit's).
	writeTask(`{"id":"t2"}`)
	push(2)
	push(3)
	v3 := filepath.Join("store", store.VersionFile("m", 3))
	for _, c := range []struct {
		name string
		read func() ([]string, map[string][]byte)
		task bool
	}{{"legacy", legacy, false}, {"current", current, true}} {
		var all []string
		gotTask := ""
		for !bytes.Equal(func() []byte {
			paths, files := c.read()
			all = append(all, paths...)
			if b, ok := files[taskRel]; ok {
				gotTask = string(b)
			}
			return files[v3]
		}(), blobs[3]) {
		}
		hasAgg := strings.Contains(strings.Join(all, "\n"), "aggregator")
		if hasAgg != c.task || c.task && gotTask != `{"id":"t2"}` {
			t.Fatalf("%s follower's units: paths %q, task %q", c.name, all, gotTask)
		}
	}
}
