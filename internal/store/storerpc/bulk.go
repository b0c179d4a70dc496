package storerpc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wire"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Data-plane methods (docs/wire.md, "Pulls on the data plane"). Each
// answers one version as a data frame whose header is a StorePullHeader
// and whose body is the version's safetensors bytes, written from the
// stored snapshot's memory; "not modified" is a header alone.
const (
	// BulkPullMethod: header StorePullRequest, the same rules as Pull
	// (chunk_bytes is ignored: there are no chunks).
	BulkPullMethod = "rlhub.v1.ModelStore/Pull"
	// BulkWatchMethod: header StoreWatchRequest; waits up to BulkWatchWait
	// for a version newer than after and answers it, or "not modified"
	// when none landed (the client asks again). A long poll, so every
	// answer leaves the connection reusable; skipped is always 0 (the
	// server keeps no state between polls).
	BulkWatchMethod = "rlhub.v1.ModelStore/Watch"
	// BulkPushMethod: header StorePushHeader (blob.total_bytes announces
	// the body; chunk_bytes is ignored), body the version's safetensors
	// bytes, read straight into the stored blob's memory once the header's
	// checks pass; response StorePushResponse. The same rules, checks and
	// errors as Push.
	BulkPushMethod = "rlhub.v1.ModelStore/Push"
)

// BulkWatchWait is how long one data-plane watch request waits for a newer
// version before it answers "not modified".
const BulkWatchWait = 5 * time.Second

// RegisterBulk serves pushes, pulls and watches on the hub's data plane
// (package bulk), unless Config.NoBulk. The gRPC methods stay, for clients
// and hubs without it.
func (s *Service) RegisterBulk(b *bulk.Server) {
	if s.cfg.NoBulk {
		return
	}
	b.Handle(BulkPushMethod, func(ctx context.Context, r *bulk.Request) (proto.Message, error) {
		hdr := &rlhubv1.StorePushHeader{}
		if err := proto.Unmarshal(r.Header, hdr); err != nil {
			return nil, fmt.Errorf("%w: push header: %v", errs.ErrInvalid, err)
		}
		info, err := s.pushBody(ctx, hdr, func(asm *wire.Assembler) error {
			body, err := r.Body(int64(hdr.Blob.TotalBytes))
			if err != nil {
				return err
			}
			_, err = asm.ReadFrom(body)
			return err
		})
		if err != nil {
			s.cfg.Logger.Debug("store: push refused", "err", err)
			return nil, err
		}
		s.cfg.Logger.Info("store: version landed", "model", info.Name, "version", info.Version, "epoch", info.Epoch, "bytes", info.Bytes)
		return &rlhubv1.StorePushResponse{Info: infoProto(info)}, nil
	})
	b.Handle(BulkPullMethod, func(ctx context.Context, r *bulk.Request) (proto.Message, error) {
		req := &rlhubv1.StorePullRequest{}
		if err := proto.Unmarshal(r.Header, req); err != nil {
			return nil, fmt.Errorf("%w: pull header: %v", errs.ErrInvalid, err)
		}
		version := req.Version
		if req.IfNewerThan != nil && version != 0 {
			return nil, fmt.Errorf("%w: if_newer_than with an exact version %d", errs.ErrInvalid, version)
		}
		snap, release, err := store.Borrow(ctx, s.cfg.Store, req.Model, version)
		if err != nil {
			return nil, err
		}
		defer release()
		if req.IfNewerThan != nil && snap.Version <= *req.IfNewerThan {
			return nil, replyNotModified(r, snap.Name, snap.Version, snap.Epoch, snap.Life())
		}
		return nil, replySnapshot(r, snap)
	})
	b.Handle(BulkWatchMethod, func(ctx context.Context, r *bulk.Request) (proto.Message, error) {
		req := &rlhubv1.StoreWatchRequest{}
		if err := proto.Unmarshal(r.Header, req); err != nil {
			return nil, fmt.Errorf("%w: watch header: %v", errs.ErrInvalid, err)
		}
		wctx, cancel := context.WithTimeout(ctx, BulkWatchWait)
		defer cancel()
		stop := context.AfterFunc(s.drainCtx, cancel)
		defer stop()
		life := uint64(0) // versions only grow, unless the watch follows lives
		if req.FollowLives {
			life = req.Life
		}
		snap, release, err := store.BorrowNewerLife(wctx, s.cfg.Store, req.Model, req.After, life)
		if err != nil {
			switch {
			case s.drainCtx.Err() != nil:
				return nil, errDraining
			case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
				return nil, replyNotModified(r, req.Model, req.After, 0, 0)
			}
			return nil, err
		}
		defer release()
		return nil, replySnapshot(r, snap)
	})
}

func replyNotModified(r *bulk.Request, model string, version, epoch, life uint64) error {
	h, err := proto.Marshal(&rlhubv1.StorePullHeader{
		Blob:        &rlhubv1.BlobInfo{Model: model, Version: version, Epoch: epoch, Life: life},
		NotModified: true,
	})
	if err != nil {
		return err
	}
	return r.Reply(h)
}

// replySnapshot sends snap whole: its header, then its blob from the
// snapshot's memory (borrowed by the caller until Reply returns, when the
// kernel has taken every byte).
func replySnapshot(r *bulk.Request, snap *store.Snapshot) error {
	h, err := proto.Marshal(&rlhubv1.StorePullHeader{
		Blob: &rlhubv1.BlobInfo{
			Model:      snap.Name,
			Version:    snap.Version,
			Epoch:      snap.Epoch,
			TotalBytes: uint64(len(snap.Blob)),
			Life:       snap.Life(),
		},
		Metadata:        snap.Metadata,
		CreatedUnixNano: snap.Created.UnixNano(),
	})
	if err != nil {
		return err
	}
	return r.Reply(h, snap.Blob)
}
