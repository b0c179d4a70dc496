//go:build linux

package wsync

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/testkit"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	"github.com/rlhub/rlhub/internal/wsync/wsynctest"
)

// A collector of model "other" given the segment of model "m" (a wrong
// path, or two models sharing a default path), by ShmDialer (leasing) or
// ShmCopyDialer, is refused with
// errs.ErrInvalid naming both models: its weights and version stay as
// they were, and the segment's one lease entry stays free. Before, the
// reader took any model's segment, and a collector whose tensors matched
// loaded the other model's weights.
func TestShmDialerRefusesAnotherModelsSegment(t *testing.T) {
	ctx := context.Background()
	w, path := threeSlots(t)
	if err := w.Publish(ctx, wsynctest.Snap(t, "m", 1, 1000)); err != nil {
		t.Fatal(err)
	}
	for lease, dial := range map[bool]Dialer{true: ShmDialer("relay-shm", path, "other"), false: ShmCopyDialer("relay-shm", path, "other")} {
		weights := weightsOf("w", 1000)
		data := weights.Tensors()[0].Data
		wsynctest.Fill(data, 77)
		before := append([]byte(nil), data...)
		f, err := NewFailover(FailoverConfig{Logger: testkit.Logger(),
			Dialers: []Dialer{dial}})
		if err != nil {
			t.Fatal(err)
		}
		r, err := NewReceiver(ReceiverConfig{Source: f, Apply: CopyInto(weights)})
		if err != nil {
			t.Fatal(err)
		}
		ok, err := r.Poll(ctx)
		f.Close()
		if ok || !errors.Is(err, errs.ErrInvalid) || !strings.Contains(err.Error(), `holds model "m", not "other"`) {
			t.Fatalf("lease %v: Poll = %v, %v; want ErrInvalid naming both models", lease, ok, err)
		}
		if string(data) != string(before) || r.Version() != 0 || r.Current() != nil {
			t.Fatalf("lease %v: the other model's v%d was loaded", lease, r.Version())
		}
	}
	// The refused leasing open claimed no entry: a reader of "m" leases.
	rd, err := shm.Open(shm.ReaderConfig{Path: path, Model: "m", Lease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if !rd.Leasing() {
		t.Fatalf("a reader of the right model cannot lease: %s", rd.CopyReason())
	}
}
