package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/hub/hubtest"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storetest"
	"github.com/rlhub/rlhub/internal/testkit"
)

// TestModelLsPages: `model ls` lists a store whose entries together are
// past gRPC's 4 MiB message limit (5000 models with 1 KB names: 5 MB),
// which one List response could not carry: the client asks page after
// page and every model is printed once, in name order.
func TestModelLsPages(t *testing.T) {
	h := hubtest.Start(t, hub.Config{Store: store.Config{MaxNameBytes: 2048}, Logger: testkit.Logger()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	blob := storetest.Blob(t, 1, 1)
	pad := strings.Repeat("z", 1000)
	const models = 5000
	name := func(i int) string { return fmt.Sprintf("big/%s-%05d", pad, i) }
	for i := range models {
		if _, err := h.Store().Push(ctx, store.PushRequest{Name: name(i), Version: 1, Blob: blob}); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := run(t, ctx, "model", "ls", "--hub", h.Addr().String())
	if code != 0 {
		t.Fatalf("ls: code %d, stderr %.300q", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != models+1 || !strings.HasPrefix(lines[0], "NAME") {
		t.Fatalf("ls printed %d lines, want a header and %d models", len(lines), models)
	}
	for i, l := range lines[1:] {
		if f := strings.Fields(l); len(f) < 2 || f[0] != name(i) || f[1] != "1" {
			t.Fatalf("line %d is %.40q…, want model %d at version 1", i+1, l, i)
		}
	}
}
