package replica

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// A running scrub judges a file only with no unit installing: a version
// that failed its first check because a unit replaced the model's
// manifest and removed the file under it (a unit can, between the two
// reads) is checked again, found gone from the manifest, and left alone
// — the position kept, nothing moved aside. The same failure with no unit
// between is damage.
func TestScrubSparesWhatAUnitChangedUnderIt(t *testing.T) {
	for _, unitBetween := range []bool{true, false} {
		root := t.TempDir()
		st, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(root, "store"), Store: store.Config{Retain: 1}, Logger: testkit.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := st.Push(ctx, store.PushRequest{Name: "m", Version: 1, Blob: storetest.Blob(t, 1, 1<<12)}); err != nil {
			t.Fatal(err)
		}
		f, err := NewFollower(FollowerConfig{DataDir: root, Member: "s", Logger: testkit.Logger(),
			Dial: func(context.Context, string) (*grpc.ClientConn, error) { return nil, errors.New("no primary here") }})
		if err != nil {
			t.Fatal(err)
		}
		f.pos = position{Epoch: 1, Unit: 7}
		v1 := filepath.Join(root, "store", store.VersionFile("m", 1))
		b, err := os.ReadFile(v1)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)-1] ^= 1
		if err := os.WriteFile(v1, b, 0o644); err != nil {
			t.Fatal(err)
		}
		f.suspected = func() {
			if unitBetween { // v2 replaces v1: the manifest drops it, its file goes
				if _, err := st.Push(ctx, store.PushRequest{Name: "m", Version: 2, Expect: 1, Blob: storetest.Blob(t, 2, 1<<12)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		damaged, err := f.Scrub(ctx, 0)
		st.Close()
		if err != nil {
			t.Fatal(err)
		}
		rel := filepath.Join("store", store.VersionFile("m", 1))
		_, aside := os.Stat(filepath.Join(root, ".replica", "damaged", rel))
		if unitBetween {
			if len(damaged) != 0 || f.position() != (position{Epoch: 1, Unit: 7}) || aside == nil {
				t.Fatalf("a version a unit removed under the scrub counted as damaged: %v, position %+v", damaged, f.position())
			}
			continue
		}
		if _, ok := damaged[rel]; !ok || len(damaged) != 1 || f.position() != (position{}) || aside != nil {
			t.Fatalf("damage with no unit between: scrub found %v (aside: %v), position %+v; want %s moved aside and the position reset",
				damaged, aside, f.position(), rel)
		}
	}
}
