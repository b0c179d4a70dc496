package replica

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A version the primary ships from the store's memory is shipped intact
// even when the writer takes its bytes back (PushRequest.Recycle, as the
// reducer does) and overwrites them while the unit is still being sent:
// the replication holds a loan on the version until no snapshot holds it,
// and only then does the store give the bytes back.
//
// The follower here is the test itself, speaking the stream: it takes its
// full sync, then stops reading, with a 64 KiB window, so the primary's
// send of the next unit (version 2, 4 MiB in 1 MiB frames) stops after a
// frame or two. Versions 3 and 4 are pushed meanwhile; with Retain 2 the
// store drops version 2 and would hand its bytes back, and the writer
// overwrites them at once. The follower then reads on: every byte of
// version 2 must be the ones pushed, and the bytes go back to the writer
// once they are shipped. With the replication codec (a follower's stream)
// gRPC still holds the bytes after SendMsg returns, until its writer has
// framed them; with the stock codec (a stream that did not ask for it)
// SendMsg copies them.
func TestReplicationShipsRecycledVersionsIntact(t *testing.T) {
	for _, codec := range []bool{true, false} {
		t.Run(fmt.Sprintf("codec=%v", codec), func(t *testing.T) { testShipsRecycledIntact(t, codec) })
	}
}

func testShipsRecycledIntact(t *testing.T, codec bool) {
	dir := t.TempDir()
	st, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(dir, "store"), Store: store.Config{Retain: 2}, Logger: testkit.Logger()})
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

	const floats = 1 << 20 // 4 MiB
	want := map[uint64][]byte{}
	var mu sync.Mutex
	recycled := map[uint64]bool{}
	push := func(v uint64) {
		t.Helper()
		want[v] = storetest.Blob(t, v, floats)
		blob := bytes.Clone(want[v])
		_, err := fenced.Push(ctx, store.PushRequest{Name: "m", Version: v, Expect: v - 1, Blob: blob, Recycle: func(b []byte) {
			for i := range b { // the writer's next step, written into the bytes it got back
				b[i] = 0xAA
			}
			mu.Lock()
			recycled[v] = true
			mu.Unlock()
		}})
		if err != nil {
			t.Fatalf("push v%d: %v", v, err)
		}
	}
	push(1)

	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	var opts []grpc.CallOption
	if codec {
		opts = append(opts, grpc.CallContentSubtype(codecName))
	}
	cs, err := cc.NewStream(ctx, &streamDesc, FollowMethod, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(jsonFrame(kindHello, hello{Member: "test", Epoch: 5})); err != nil {
		t.Fatal(err)
	}
	// got collects every file the stream carries, by path, in order.
	got := map[string][][]byte{}
	readUnit := func() {
		t.Helper()
		_, files := readFollowUnit(t, cs)
		for p, b := range files {
			got[p] = append(got[p], b)
		}
	}
	readUnit() // the full sync: version 1
	// A term's first snapshot is the base the next compares with: it
	// reads nothing (its unit is the follower's own cut). Take it here,
	// on another model, so that version 2's is a snapshot that ships
	// from memory.
	if _, err := fenced.Push(ctx, store.PushRequest{Name: "base", Version: 1, Blob: storetest.Blob(t, 1, 16)}); err != nil {
		t.Fatal(err)
	}
	readUnit()

	push(2)
	testkit.Eventually(t, 30*time.Second, "a snapshot of version 2 taken from memory", func() bool { return src.fromMemory.Load() >= 1 })
	push(3)
	push(4) // drops version 2 from the store
	v2 := filepath.Join("store", store.VersionFile("m", 2))
	for len(got[v2]) == 0 {
		readUnit()
	}
	for i, b := range got[v2] {
		if !bytes.Equal(b, want[2]) {
			t.Fatalf("version 2 as shipped (%d of %d) differs from the pushed bytes (%d bytes, %d shipped)", i+1, len(got[v2]), len(want[2]), len(b))
		}
	}
	// The follower holds version 2's snapshot: the loan ends, the bytes
	// go back to the writer.
	go func() {
		for {
			var m wrapperspb.BytesValue
			if cs.RecvMsg(&m) != nil {
				return
			}
		}
	}()
	testkit.Eventually(t, 30*time.Second, "version 2's bytes given back to the writer", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return recycled[2]
	})
	if n := src.fromMemory.Load(); n == 0 {
		t.Fatal("no version was shipped from memory")
	}
}

// readFollowUnit reads one unit off a follow stream: the paths it names
// (each as its kind letter, a space and the path, in order) and the bytes
// of each file it carries.
func readFollowUnit(t *testing.T, cs grpc.ClientStream) ([]string, map[string][]byte) {
	t.Helper()
	var paths []string
	files := map[string][]byte{}
	var cur string
	var left int64
	for {
		var m wrapperspb.BytesValue
		if err := cs.RecvMsg(&m); err != nil {
			t.Fatalf("stream: %v", err)
		}
		b := m.GetValue()
		if left > 0 {
			files[cur] = append(files[cur], b...)
			left -= int64(len(b))
			continue
		}
		switch b[0] {
		case kindFile, kindKeep, kindDelete:
			rel, size, err := parsePath(b[0], b[1:])
			if err != nil {
				t.Fatal(err)
			}
			paths = append(paths, string(b[0])+" "+rel)
			cur, left = rel, size
		case kindEnd:
			return paths, files
		}
	}
}
