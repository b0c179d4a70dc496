package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/cluster"
	"github.com/rlhub/rlhub/internal/errs"
)

// FollowerConfig configures a standby's side of replication.
type FollowerConfig struct {
	// DataDir is the standby's --data; required. Its ars/, reducer/ and
	// store/ become copies of the primary's; DataDir/.replica holds the
	// staging area and the highest epoch seen.
	DataDir string
	// Member is this hub's member id (the primary counts acks by it).
	Member string
	// Dial connects to the primary; required.
	Dial func(ctx context.Context, addr string) (*grpc.ClientConn, error)
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Follower applies a primary's units to a standby's data directory.
type Follower struct {
	cfg    FollowerConfig
	synced atomic.Bool // a full sync completed (since the last Follow began)
	units  atomic.Uint64

	mu    sync.Mutex
	epoch uint64 // highest primary epoch seen, persisted
}

// NewFollower opens the standby's side (reading the highest epoch it has
// followed).
func NewFollower(cfg FollowerConfig) (*Follower, error) {
	if cfg.DataDir == "" || cfg.Dial == nil {
		return nil, fmt.Errorf("%w: replica: a follower needs DataDir and Dial", errs.ErrInvalid)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	f := &Follower{cfg: cfg}
	if err := os.MkdirAll(f.dir(), 0o755); err != nil {
		return nil, fmt.Errorf("replica: %w", err)
	}
	if b, err := os.ReadFile(filepath.Join(f.dir(), "epoch")); err == nil {
		f.epoch, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	return f, nil
}

func (f *Follower) dir() string { return filepath.Join(f.cfg.DataDir, ".replica") }

// Synced reports whether a full sync with the primary being followed has
// completed: the standby holds every unit that primary acknowledged to
// it since.
func (f *Follower) Synced() bool { return f.synced.Load() }

// Units counts the units applied.
func (f *Follower) Units() uint64 { return f.units.Load() }

// Epoch is the highest primary epoch this data directory has followed.
func (f *Follower) Epoch() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.epoch
}

// ObserveEpoch raises the highest epoch seen (a term this hub held, or
// saw elected) and persists it: no primary of an older term is followed
// afterwards.
func (f *Follower) ObserveEpoch(e uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e <= f.epoch {
		return nil
	}
	if err := atomicfile.Write(filepath.Join(f.dir(), "epoch"), []byte(strconv.FormatUint(e, 10)+"\n")); err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	f.epoch = e
	return nil
}

// Follow streams from leader and applies its units until the stream
// ends, ctx ends, or a unit is refused. A leader whose epoch is older than
// one this standby has seen is refused (fencing).
func (f *Follower) Follow(ctx context.Context, leader cluster.Leader) error {
	f.synced.Store(false)
	if seen := f.Epoch(); leader.Epoch < seen {
		return fmt.Errorf("%w: replica: %s holds epoch %d, older than %d seen here; not following",
			errs.ErrStale, leader.Addr, leader.Epoch, seen)
	}
	if err := f.ObserveEpoch(leader.Epoch); err != nil {
		return err
	}
	have, err := inventory(f.cfg.DataDir)
	if err != nil {
		return err
	}
	cc, err := f.cfg.Dial(ctx, leader.Addr)
	if err != nil {
		return fmt.Errorf("%w: replica: dial %s: %v", errs.ErrUnavailable, leader.Addr, err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cs, err := cc.NewStream(ctx, &streamDesc, FollowMethod)
	if err != nil {
		return fmt.Errorf("%w: replica: %v", errs.ErrUnavailable, err)
	}
	if err := cs.SendMsg(jsonFrame(kindHello, hello{Member: f.cfg.Member, Epoch: leader.Epoch, Have: have})); err != nil {
		return fmt.Errorf("%w: replica: hello: %v", errs.ErrUnavailable, err)
	}
	for {
		u, err := f.applyUnit(cs, leader.Epoch)
		if err != nil {
			return err
		}
		f.units.Add(1)
		if err := cs.SendMsg(uvarintFrame(kindAck, u)); err != nil {
			return fmt.Errorf("%w: replica: ack: %v", errs.ErrUnavailable, err)
		}
	}
}

type staged struct {
	rel, tmp string
}

// applyUnit receives one unit into the staging area and, once its end
// arrives whole, installs it; a unit cut short changes nothing.
func (f *Follower) applyUnit(cs grpc.ClientStream, epoch uint64) (uint64, error) {
	recv := func() ([]byte, error) {
		var m wrapperspb.BytesValue
		if err := cs.RecvMsg(&m); err != nil {
			return nil, fmt.Errorf("%w: replica: stream: %v", errs.ErrUnavailable, err)
		}
		if len(m.GetValue()) == 0 {
			return nil, errFrame
		}
		return m.GetValue(), nil
	}
	b, err := recv()
	if err != nil {
		return 0, err
	}
	var bg begin
	if b[0] != kindBegin {
		return 0, errFrame
	}
	if err := parseJSON(b[1:], &bg); err != nil {
		return 0, err
	}
	if bg.Epoch != epoch {
		return 0, fmt.Errorf("%w: replica: unit from epoch %d on a stream of epoch %d", errs.ErrStale, bg.Epoch, epoch)
	}
	stage, err := os.MkdirTemp(f.dir(), "unit-")
	if err != nil {
		return 0, fmt.Errorf("replica: %w", err)
	}
	defer os.RemoveAll(stage)
	var files []staged
	var gone []string
	mentioned := map[string]bool{}
	for {
		b, err := recv()
		if err != nil {
			return 0, err
		}
		switch b[0] {
		case kindFile:
			rel, size, err := parsePath(kindFile, b[1:])
			if err != nil {
				return 0, err
			}
			tmp := filepath.Join(stage, strconv.Itoa(len(files)))
			if err := f.receiveFile(recv, tmp, size); err != nil {
				return 0, err
			}
			files = append(files, staged{rel: rel, tmp: tmp})
			mentioned[rel] = true
		case kindKeep:
			rel, _, err := parsePath(kindKeep, b[1:])
			if err != nil {
				return 0, err
			}
			mentioned[rel] = true
		case kindDelete:
			rel, _, err := parsePath(kindDelete, b[1:])
			if err != nil {
				return 0, err
			}
			gone = append(gone, rel)
		case kindEnd:
			u, _, err := parseUvarint(b[1:])
			if err != nil || u != bg.Unit {
				return 0, errFrame
			}
			if err := f.install(files, gone, bg.Full, mentioned); err != nil {
				return 0, err
			}
			if bg.Full {
				f.synced.Store(true)
				f.cfg.Logger.Info("replica: full sync applied", "files", len(files), "kept", len(mentioned)-len(files), "epoch", epoch)
			}
			return u, nil
		default:
			return 0, errFrame
		}
	}
}

func (f *Follower) receiveFile(recv func() ([]byte, error), tmp string, size int64) error {
	out, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	for left := size; left > 0; {
		b, err := recv()
		if err != nil {
			out.Close()
			return err
		}
		if b[0] != kindData || int64(len(b)-1) > left {
			out.Close()
			return errFrame
		}
		if _, err := out.Write(b[1:]); err != nil {
			out.Close()
			return fmt.Errorf("replica: %w", err)
		}
		left -= int64(len(b) - 1)
	}
	return errors.Join(out.Sync(), out.Close())
}

// install renames a whole unit into place, removes what the primary
// removed (for a full sync: every mirrored file it did not mention), and
// syncs the directories touched.
func (f *Follower) install(files []staged, gone []string, full bool, mentioned map[string]bool) error {
	dirs := map[string]bool{}
	for _, s := range files {
		if err := install(f.cfg.DataDir, s.tmp, s.rel); err != nil {
			return fmt.Errorf("replica: install %s: %w", s.rel, err)
		}
		dirs[filepath.Dir(filepath.Join(f.cfg.DataDir, s.rel))] = true
	}
	if full {
		es, err := walk(f.cfg.DataDir, mirroredDirs)
		if err != nil {
			return err
		}
		for _, e := range es {
			if !mentioned[e.rel] {
				gone = append(gone, e.rel)
			}
		}
	}
	for _, rel := range gone {
		p := filepath.Join(f.cfg.DataDir, rel)
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("replica: remove %s: %w", rel, err)
		}
		dirs[filepath.Dir(p)] = true
	}
	for d := range dirs {
		if err := atomicfile.SyncDir(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("replica: %w", err)
		}
	}
	return nil
}
