package relay

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	hubdial "github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/store/storerpc"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wsync/shm"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// castagnoli is the CRC-32C table of the shm layout's per-version checksum.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errNoBulk: the upstream does not serve the store's data-plane watch;
// the relay follows it over the WeightSync push stream instead.
var errNoBulk = errors.New("wsync: upstream has no data-plane watch")

// relayPiece is how much of a version the relay reads from the socket
// before checksumming it (while it is in cache).
const relayPiece = 256 << 10

// followBulk follows the upstream store's data-plane watch (long polls,
// storerpc.BulkWatchMethod): each version's bytes go from the socket
// straight into the relay's next shared-memory slot as they arrive
// (cut-through, CRC-32C computed piece by piece), and the slot is
// published only once the whole version has arrived, parsed as valid
// safetensors, and the upstream's final status said OK. A version cut off
// mid-stream, or invalid, is never published (the slot is aborted). Stream
// collectors get a copy on the relay's board afterwards, made only while
// one of them waits for it, else when one asks (materialize).
//
// A version over MaxModelBytes is refused once (Refusals, logged as an
// error): the next poll asks for a version newer than it, so the relay
// neither fetches its header again every Backoff nor stops serving the
// version it has.
//
// The watch follows lives (docs/weight-sync.md, "Lives"): a model deleted
// and pushed again upstream is sent, and published, at once, though its
// version is not newer than the one the relay has.
func (r *Relay) followBulk(ctx context.Context, have *uint64) error {
	for ctx.Err() == nil {
		after, life := *have, r.life
		if r.skipTo.set {
			after, life = r.skipTo.version, r.skipTo.life // a refused version is the newest seen
		}
		v, err := r.pollBulk(ctx, after, life)
		if err != nil {
			if big := (*tooBigError)(nil); errors.As(err, &big) {
				r.refusedMu.Lock()
				r.refused = Refusals{Count: r.refused.Count + 1, Version: big.version, Err: big.Error()}
				r.refusedMu.Unlock()
				r.skipTo = versionLife{version: big.version, life: big.life, set: true}
				r.cfg.Logger.Error("wsync: relay cannot take a version over its MaxModelBytes; serving the one it has until a newer one",
					"model", r.cfg.Model, "version", big.version, "bytes", big.bytes, "max_model_bytes", r.cfg.MaxModelBytes, "serving", *have)
				continue
			}
			if grpcerr.Code(err) == codes.Unimplemented || errors.Is(err, bulk.ErrNotSupported) {
				return errNoBulk
			}
			r.upstreamFailed(err)
			return err
		}
		if v != 0 {
			*have = v
			r.have.Store(v)
			r.skipTo = versionLife{}
		}
	}
	return ctx.Err()
}

// versionLife is a version and its life; set tells it from none.
type versionLife struct {
	version, life uint64
	set           bool
}

// tooBigError is a version over MaxModelBytes (errs.ErrFull).
type tooBigError struct {
	version uint64
	life    uint64
	bytes   int64
	max     int64
}

func (e *tooBigError) Error() string {
	return fmt.Sprintf("wsync: version %d of %d bytes exceeds the relay's MaxModelBytes %d", e.version, e.bytes, e.max)
}

func (e *tooBigError) Unwrap() error { return errs.ErrFull }

// pollBulk runs one long poll for a version newer than after, or of
// another life than life (the life of after; 0: unknown); it returns the
// version published, or 0 when nothing newer landed.
func (r *Relay) pollBulk(ctx context.Context, after, life uint64) (uint64, error) {
	cctx, cancel := context.WithTimeout(ctx, storerpc.BulkWatchWait+r.cfg.PollTimeout)
	defer cancel()
	var (
		hdr  rlhubv1.StorePullHeader
		txn  *shm.Write // the slot being filled, when publishing to shared memory
		blob []byte     // where the version was received
		crc  uint32
		file *safetensors.File
	)
	defer func() {
		if txn != nil {
			txn.Abort() // not committed below: the version is not published
			r.shmMu.Unlock()
		}
	}()
	addr, ok := r.upstreamAddr()
	if !ok {
		return 0, fmt.Errorf("%w: relay: cluster %s: no primary known yet", errs.ErrUnavailable, errs.Quote(r.cfg.UpstreamAddr))
	}
	// Ended if the followed primary moves away (its machine may be gone
	// without a word).
	up, _ := r.cfg.Upstream.(interface{ Target() string })
	pctx, planeDone := hubdial.PlaneContext(up, cctx)
	err := r.bulk.CallRecv(pctx, addr, storerpc.BulkWatchMethod,
		&rlhubv1.StoreWatchRequest{Model: r.cfg.Model, After: after, FollowLives: true, Life: life}, nil,
		func(hb []byte, n int64, body io.Reader) error {
			if err := proto.Unmarshal(hb, &hdr); err != nil {
				return fmt.Errorf("%w: wsync: upstream watch header: %v", errs.ErrInvalid, err)
			}
			if hdr.NotModified {
				return nil
			}
			b := hdr.GetBlob()
			switch {
			case b.GetModel() != r.cfg.Model:
				return fmt.Errorf("%w: wsync: upstream sent model %s for %s", errs.ErrInvalid, errs.Quote(b.GetModel()), errs.Quote(r.cfg.Model))
			case uint64(n) != b.GetTotalBytes():
				return fmt.Errorf("%w: wsync: upstream sent %d bytes for a %d-byte version", errs.ErrInvalid, n, b.GetTotalBytes())
			case b.GetVersion() <= after && (life == 0 || b.GetLife() == 0 || b.GetLife() == life):
				return fmt.Errorf("%w: wsync: upstream sent version %d after %d", errs.ErrInvalid, b.GetVersion(), after)
			case n > r.cfg.MaxModelBytes:
				return &tooBigError{version: b.GetVersion(), life: b.GetLife(), bytes: n, max: r.cfg.MaxModelBytes}
			case b.GetEpoch() < r.epoch:
				return r.olderEpoch(b.GetVersion(), b.GetEpoch())
			}
			if r.cfg.ShmPath != "" {
				t, err := r.beginShm(b.GetVersion(), b.GetEpoch(), b.GetLife(), int(n))
				if err != nil {
					r.cfg.Logger.Warn("wsync: relay could not publish to shared memory", "path", r.cfg.ShmPath, "version", b.GetVersion(), "err", err)
				} else {
					txn = t
					blob = t.Buf()
				}
			}
			if blob == nil {
				blob = make([]byte, n)
			}
			for off := 0; off < len(blob); {
				end := min(off+relayPiece, len(blob))
				if _, err := io.ReadFull(body, blob[off:end]); err != nil {
					return err
				}
				crc = crc32.Update(crc, castagnoli, blob[off:end])
				off = end
				if txn != nil {
					txn.Progress(off) // local collectors copy it behind the socket
				}
			}
			f, err := safetensors.Decode(blob)
			if err != nil {
				return fmt.Errorf("wsync: upstream version %d: %w", b.GetVersion(), err)
			}
			file = f
			return nil
		}, nil)
	if err = planeDone(err); err != nil {
		return 0, err
	}
	if hdr.NotModified || file == nil {
		return 0, nil
	}
	b := hdr.GetBlob()
	r.epoch = b.GetEpoch() // not below it: checked above
	r.life = b.GetLife()
	if txn == nil && r.cfg.ShmPath != "" {
		// The segment did not take this version (it could not: too big
		// for a new one, no room): the board now leads,
		// and materialize must not copy the segment's older head over it.
		r.segHead.Store(nil)
	}
	if txn != nil {
		if err := txn.Commit(crc); err != nil {
			return 0, err
		}
		txn = nil
		// Stream collectors get their own immutable copy (the slot is
		// rewritten two versions from now), but only when one is waiting:
		// the others make it on demand from the segment (materialize).
		// segHead is stored before waiting is loaded, and a waiter adds
		// itself before it loads segHead, so one of the two copies it.
		r.segHead.Store(&segVersion{version: b.GetVersion(), created: time.Unix(0, hdr.CreatedUnixNano), life: b.GetLife()})
		if r.waiting.Load() == 0 {
			r.shmMu.Unlock()
			return b.GetVersion(), nil
		}
		blob = append(make([]byte, 0, len(blob)), blob...)
		r.shmMu.Unlock()
		if file, err = safetensors.Decode(blob); err != nil {
			return 0, err
		}
	}
	snap := store.WithLife(&store.Snapshot{Name: b.GetModel(), Version: b.GetVersion(), Epoch: b.GetEpoch(), Blob: blob,
		Tensors: file.Tensors, Metadata: file.Metadata, Created: time.Unix(0, hdr.CreatedUnixNano)}, b.GetLife())
	if err := r.board.Publish(context.Background(), snap); err != nil && !errors.Is(err, errs.ErrStale) {
		return 0, err
	}
	return b.GetVersion(), nil
}

// beginShm opens an in-place write of a version of n bytes and of life
// life into the relay's segment, creating, growing or replacing the
// segment first as publishShm does. On success shmMu stays locked until the write is committed or
// aborted.
func (r *Relay) beginShm(version, epoch, life uint64, n int) (*shm.Write, error) {
	r.shmMu.Lock()
	if err := r.ensureShm(int64(n), life); err != nil {
		r.shmMu.Unlock()
		return nil, err
	}
	t, err := r.shm.Begin(version, epoch, n)
	if err != nil {
		r.shmMu.Unlock()
		return nil, err
	}
	return t, nil
}

// upstreamAddr is where the data-plane watch dials: the primary that
// Upstream follows when UpstreamAddr is a cluster target (internal/dial),
// else UpstreamAddr; false while a cluster knows no primary yet.
func (r *Relay) upstreamAddr() (string, bool) {
	c, _ := r.cfg.Upstream.(interface{ Target() string })
	return hubdial.PlaneAddr(c, r.cfg.UpstreamAddr)
}

// upstreamFailed tells a cluster target's connection what the data plane
// saw (hubdial.PlaneFailed: a standby's refusal names the primary to
// follow, any other failure re-resolves; a plain address ignores both).
func (r *Relay) upstreamFailed(err error) {
	if c, ok := r.cfg.Upstream.(interface{ Target() string }); ok {
		hubdial.PlaneFailed(c, err)
	}
}
