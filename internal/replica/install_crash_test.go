package replica_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/cluster/clustertest"
	"github.com/rlhub/rlhub/internal/replica"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestStandbyKilledMidInstallHoldsNoMixedUnit: a standby is SIGKILLed at
// a named point of a unit's install (RLHUB_TEST_REPLICA_CRASH) while the
// primary publishes: with the commit marker written and one file of the
// unit moved (install-mid), its next start rolls the unit forward —
// every file the marker names is in place with the staged bytes — and
// saves the unit's position (the marker's), as it does when killed with
// every file moved and the marker not yet the saved position
// (unit-installed); killed before the marker (unit-staged), the staged
// unit is discarded and the saved position stays the unit before. Either
// way the copy it is left with opens as a store whose every version is
// byte-identical to what was published.
func TestStandbyKilledMidInstallHoldsNoMixedUnit(t *testing.T) {
	for _, tc := range []struct {
		point  string
		marked bool
		moved  string // how many of the marked unit's files were moved: "some" or "all"
	}{{"install-mid:3", true, "some"}, {"unit-installed:3", true, "all"}, {"unit-staged:3", false, ""}} {
		t.Run(strings.Split(tc.point, ":")[0], func(t *testing.T) {
			e := clustertest.Start(t)
			c := newClusterTTL(t, e.Endpoint, 1, "2s", "--replica-acks", "0")
			_, primary := c.leader(0)
			blobs := map[uint64][]byte{1: storetest.Blob(t, 1, 4096)}
			c.push("pol", 1, 0, blobs[1])

			sb := &hubProc{t: t, id: "h1", data: t.TempDir(), args: []string{"--replica-acks", "0"}}
			c.hubs = append(c.hubs, sb)
			t.Setenv("RLHUB_TEST_REPLICA_CRASH", tc.point)
			c.start(sb)
			os.Unsetenv("RLHUB_TEST_REPLICA_CRASH") // the primary's restarts, if any, run without it

			// Publish until the standby kills itself at the point.
			deadline := time.Now().Add(90 * time.Second)
			for v := uint64(2); ; v++ {
				select {
				case <-sb.proc.Done():
				default:
					if time.Now().After(deadline) {
						t.Fatalf("the standby never reached %s:\n%s", tc.point, sb.out)
					}
					blobs[v] = storetest.Blob(t, v, 4096)
					c.push("pol", v, v-1, blobs[v])
					time.Sleep(20 * time.Millisecond)
					continue
				}
				break
			}
			primary.kill() // nothing changes under the inspection

			stages, _ := filepath.Glob(filepath.Join(sb.data, ".replica", "unit-*"))
			if len(stages) != 1 {
				t.Fatalf("%d staged units after the kill, want 1: %v", len(stages), stages)
			}
			want := map[string][]byte{}
			var saved struct{ Epoch, Unit uint64 }
			if b, err := os.ReadFile(filepath.Join(sb.data, ".replica", "position")); err != nil {
				t.Fatalf("no saved position after units were acknowledged: %v", err)
			} else if err := json.Unmarshal(b, &saved); err != nil {
				t.Fatal(err)
			}
			wantEpoch, wantUnit := saved.Epoch, saved.Unit
			mb, err := os.ReadFile(filepath.Join(stages[0], "COMMIT"))
			if tc.marked {
				if err != nil {
					t.Fatalf("killed at %s: no commit marker: %v", tc.point, err)
				}
				var mk struct {
					Files       []struct{ Rel, Staged string }
					Epoch, Unit uint64
				}
				if err := json.Unmarshal(mb, &mk); err != nil {
					t.Fatal(err)
				}
				if mk.Epoch != saved.Epoch || mk.Unit <= saved.Unit {
					t.Fatalf("killed at %s: the marker's position %d/%d is not ahead of the saved %d/%d", tc.point, mk.Epoch, mk.Unit, saved.Epoch, saved.Unit)
				}
				wantEpoch, wantUnit = mk.Epoch, mk.Unit
				pending := 0
				for _, f := range mk.Files {
					b, err := os.ReadFile(filepath.Join(stages[0], f.Staged))
					if errors.Is(err, os.ErrNotExist) {
						b, err = os.ReadFile(filepath.Join(sb.data, f.Rel)) // moved before the kill
					} else {
						pending++
					}
					if err != nil {
						t.Fatal(err)
					}
					want[f.Rel] = b
				}
				if tc.moved == "some" && (pending == 0 || pending == len(mk.Files)) || tc.moved == "all" && pending != 0 {
					t.Fatalf("killed at %s with %d of %d files moved, want %s", tc.point, len(mk.Files)-pending, len(mk.Files), tc.moved)
				}
			} else if !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("killed at %s: commit marker %v, want none", tc.point, err)
			}

			// The standby's next start (NewFollower is where it recovers).
			f, err := replica.NewFollower(replica.FollowerConfig{DataDir: sb.data, Logger: testkit.Logger(),
				Dial: func(context.Context, string) (*grpc.ClientConn, error) { return nil, errors.New("not dialled") }})
			if err != nil {
				t.Fatal(err)
			}
			if e, u := f.PositionForTest(); e != wantEpoch || u != wantUnit {
				t.Fatalf("killed at %s: position after recovery %d/%d, want %d/%d", tc.point, e, u, wantEpoch, wantUnit)
			}
			if left, _ := filepath.Glob(filepath.Join(sb.data, ".replica", "unit-*")); len(left) != 0 {
				t.Fatalf("staged units left after recovery: %v", left)
			}
			for rel, b := range want {
				got, err := os.ReadFile(filepath.Join(sb.data, rel))
				if err != nil || !bytes.Equal(got, b) {
					t.Fatalf("%s after the roll forward: %d bytes (%v), want the unit's %d", rel, len(got), err, len(b))
				}
			}
			st, err := store.OpenFile(store.FileConfig{Dir: filepath.Join(sb.data, "store"), Logger: testkit.Logger()})
			if err != nil {
				t.Fatalf("the standby's copy does not open as a store: %v", err)
			}
			defer st.Close()
			infos, err := st.List(context.Background())
			if err != nil || len(infos) != 1 || len(infos[0].Retained) == 0 {
				t.Fatalf("the standby's copy lists %+v (%v), want pol", infos, err)
			}
			for _, v := range infos[0].Retained {
				snap, err := st.Get(context.Background(), "pol", v)
				if err != nil || !bytes.Equal(snap.Blob, blobs[v]) {
					t.Fatalf("the standby's pol v%d: %v, not the published bytes", v, err)
				}
			}
			t.Logf("killed at %s: the copy holds pol %v", tc.point, infos[0].Retained)
		})
	}
}
