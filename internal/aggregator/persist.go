package aggregator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/errs"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// The current task is the aggregator's only durable state (Config.DataDir,
// the hub's --data/aggregator): DIR/task.json holds its id, info, merge
// options and the learner order and batch sizes its last GetDataDemand
// recorded, replaced whole (temporary file, fsync, rename) by each Start
// and each demand before either answers. A hub restarted on its data, or
// a standby promoted in its place (the file is replicated like the ARS
// runs), serves the same task: learners that attach are started on it
// (catch-up), and the coordinator's next Learn needs no new Start.
// Learners, leases and a Learn in flight are not kept: the learners
// attach again, and a Learn cut by the hub's death is the caller's to
// redo (its outcome is unknown: learners may have pushed gradients).
const (
	taskFileName   = "task.json"
	taskFileFormat = 1
	// maxTaskFileBytes bounds what load reads: a task's info arrived in
	// one gRPC message (the hub's bound is far below this).
	maxTaskFileBytes = 64 << 20
)

// diskTask is task.json.
type diskTask struct {
	Format int    `json:"format"`
	Seq    uint64 `json:"seq"`
	ID     string `json:"id"`
	// Info and Merge are protojson: the task's info and the merge
	// options it was started with (absent: the hub's).
	Info  json.RawMessage `json:"info"`
	Merge json.RawMessage `json:"merge,omitempty"`
	Order []string        `json:"order,omitempty"`
	Sizes []int64         `json:"sizes,omitempty"`
}

// saveTask writes t as the current task (through Config.WriteState); a
// no-op without a DataDir. A failed write is Unavailable (disk), or the
// store's refusal or ErrNotAcknowledged (cluster).
func (s *Service) saveTask(ctx context.Context, t *taskState) error {
	if s.cfg.DataDir == "" {
		return nil
	}
	if s.cfg.WriteState != nil {
		return s.cfg.WriteState(ctx, func() error { return s.writeTask(t) })
	}
	return s.writeTask(t)
}

func (s *Service) writeTask(t *taskState) error {
	info, err := protojson.Marshal(t.info)
	if err != nil {
		return fmt.Errorf("aggregator: task %q info: %w", t.id, err)
	}
	d := diskTask{Format: taskFileFormat, Seq: t.seq, ID: t.id, Info: info, Order: t.order, Sizes: t.sizes}
	if t.opts != nil {
		if d.Merge, err = protojson.Marshal(t.opts); err != nil {
			return fmt.Errorf("aggregator: task %q merge options: %w", t.id, err)
		}
	}
	b, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("aggregator: task %q: %w", t.id, err)
	}
	if err := atomicfile.MkdirAll(s.cfg.DataDir, 0o755); err != nil {
		return fmt.Errorf("%w: aggregator: %v", errs.ErrUnavailable, err)
	}
	path := filepath.Join(s.cfg.DataDir, taskFileName)
	if err := atomicfile.Write(path, b, []byte("\n")); err != nil {
		return fmt.Errorf("%w: aggregator: saving task %q: %v", errs.ErrUnavailable, t.id, err)
	}
	if s.cfg.StateChanged != nil {
		s.cfg.StateChanged(path)
	}
	return nil
}

// loadTask reads the saved current task: nil when there is none.
func (s *Service) loadTask() (*taskState, error) {
	if s.cfg.DataDir == "" {
		return nil, nil
	}
	path := filepath.Join(s.cfg.DataDir, taskFileName)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("aggregator: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTaskFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("aggregator: reading %s: %w", path, err)
	}
	if len(b) > maxTaskFileBytes {
		return nil, fmt.Errorf("aggregator: %s is over %d bytes", path, maxTaskFileBytes)
	}
	bad := func(why string, err error) error {
		return fmt.Errorf("aggregator: %s is not a saved task (%s: %v); move it away to start without the task", path, why, err)
	}
	var d diskTask
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, bad("json", err)
	}
	if d.Format != taskFileFormat {
		return nil, bad("format", fmt.Errorf("%d, this build reads %d", d.Format, taskFileFormat))
	}
	// Start numbers tasks from 1: a learner's 0 means "started on none".
	if d.ID == "" || d.Seq == 0 || len(d.Order) != len(d.Sizes) {
		return nil, bad("fields", fmt.Errorf("id %s, seq %d, %d learners in order, %d sizes", errs.Quote(d.ID), d.Seq, len(d.Order), len(d.Sizes)))
	}
	// What Start and a demand would have refused is refused here too,
	// naming the file, rather than failing later in a split.
	if err := validTaskID(d.ID); err != nil {
		return nil, bad("id", err)
	}
	seen := make(map[string]bool, len(d.Order))
	var rows int64
	for i, id := range d.Order {
		if err := validID(id); err != nil {
			return nil, bad("order", err)
		}
		if seen[id] || d.Sizes[i] < 0 {
			return nil, bad("order", fmt.Errorf("learner %s listed twice or with a negative size %d", errs.Quote(id), d.Sizes[i]))
		}
		if d.Sizes[i] > MaxDemandRows-rows {
			return nil, bad("sizes", fmt.Errorf("batch sizes add up past %d rows at learner %s", int64(MaxDemandRows), errs.Quote(id)))
		}
		rows += d.Sizes[i]
		seen[id] = true
	}
	t := &taskState{seq: d.Seq, id: d.ID, info: &structpb.Struct{}, order: d.Order, sizes: d.Sizes}
	if err := protojson.Unmarshal(d.Info, t.info); err != nil {
		return nil, bad("info", err)
	}
	if len(d.Merge) > 0 {
		t.opts = &rlhubv1.MergeOptions{}
		if err := protojson.Unmarshal(d.Merge, t.opts); err != nil {
			return nil, bad("merge", err)
		}
	}
	if t.merge, err = s.merge.With(t.opts); err != nil {
		return nil, bad("merge", err)
	}
	return t, nil
}
