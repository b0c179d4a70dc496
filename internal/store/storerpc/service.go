package storerpc

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wire"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// Config configures the service.
type Config struct {
	// Store is the store served; required. The service does not close it.
	Store store.Store
	// ChunkBytes is the largest chunk sent; 0 means wire.DefaultChunkBytes.
	// A client may ask for smaller chunks, never larger.
	ChunkBytes int
	// MaxModelBytes bounds a pushed blob when Store does not implement
	// store.Prechecker (which then decides); 0 means 1 GiB.
	MaxModelBytes int64
	// MaxHeaderBytes bounds a pushed blob's JSON header; 0 means 16 MiB.
	MaxHeaderBytes int64
	// NoBulk leaves pushes, pulls and watches off the hub's data plane
	// (RegisterBulk registers nothing): clients then use gRPC, as against
	// a hub that predates them. The zero value serves them.
	NoBulk bool
	// MaxPushBytesInFlight bounds the bytes the pushes in progress hold
	// together (each its announced size, allocated before its body is
	// read): a push waits for room, up to pushRoomWait, then fails
	// ResourceExhausted. 0 means DefaultMaxPushBytesInFlight; a push
	// larger than the bound waits for every other to finish. Without it,
	// a writer opening pushes of the largest size and trickling their
	// bodies held their whole sizes for minutes each.
	MaxPushBytesInFlight int64
	// Auth, when set, holds the tokens' quotas (auth.Verifier.ReserveQuota):
	// a push past its token's max-models or max-bytes fails with
	// ResourceExhausted before its body is read. nil means no quotas. The
	// owner of a pushed model comes from the call's token either way
	// (auth.FromContext; docs/security.md, Owners).
	Auth *auth.Verifier
	// Deleted, when set, is called once Delete has removed a model, before
	// the call returns: the hub's reducer drops the model's registration
	// then (reducer.Service.ModelDeleted), so that the model, pushed
	// again, can be registered again at once. nil: no one is told.
	Deleted func(ctx context.Context, model string)
	// PushGuard, when set, is asked whether a push may land, with its
	// model and the life its header names (BlobInfo.life; the store names
	// a version's life itself, so only the guard reads it), once its body
	// is received: an error refuses the push, which changes nothing; else
	// release is called once the store's push has returned. The hub's
	// reducer refuses an optimizer host's checkpoint of a step of a model
	// deleted since (reducer.Service.GuardHostState). nil: every push
	// goes to the store.
	PushGuard func(ctx context.Context, model string, life uint64) (release func(), err error)
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

func (c *Config) validate() error {
	if c.Store == nil {
		return errors.New("storerpc: Config.Store is required")
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = wire.DefaultChunkBytes
	}
	if c.ChunkBytes < 1024 {
		return fmt.Errorf("storerpc: ChunkBytes %d is below 1 KiB", c.ChunkBytes)
	}
	if c.MaxModelBytes == 0 {
		c.MaxModelBytes = 1 << 30
	}
	if c.MaxModelBytes < 16 {
		return fmt.Errorf("storerpc: MaxModelBytes %d is too small", c.MaxModelBytes)
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = 16 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Service is the ModelStore gRPC service. Its handlers run on gRPC's
// goroutines; it starts none of its own.
type Service struct {
	rlhubv1.UnimplementedModelStoreServer
	cfg Config

	drainCtx context.Context // done once Drain or Close is called
	drain    context.CancelFunc
	once     sync.Once
	inFlight *wire.Budget // Config.MaxPushBytesInFlight
}

// DefaultMaxPushBytesInFlight is Config.MaxPushBytesInFlight's default.
const DefaultMaxPushBytesInFlight = 4 << 30

// pushRoomWait is how long a push waits for room among the bytes of the
// pushes in progress (Config.MaxPushBytesInFlight).
const pushRoomWait = 30 * time.Second

// New returns a service over cfg.Store.
func New(cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.MaxPushBytesInFlight <= 0 {
		cfg.MaxPushBytesInFlight = DefaultMaxPushBytesInFlight
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Service{cfg: cfg, drainCtx: ctx, drain: cancel, inFlight: wire.NewBudget(cfg.MaxPushBytesInFlight, pushRoomWait)}, nil
}

// Register implements hub.Service.
func (s *Service) Register(g *grpc.Server) { rlhubv1.RegisterModelStoreServer(g, s) }

// Drain ends every open Watch with Unavailable and makes new ones fail the
// same way, so a graceful server stop need not wait for them. Pushes and
// pulls in flight finish normally.
func (s *Service) Drain() { s.drain() }

// Close implements hub.Service: it drains. Safe to call twice.
func (s *Service) Close() error {
	s.drain()
	return nil
}

var errDraining = fmt.Errorf("%w: model store service is stopping", errs.ErrUnavailable)

// Push implements ModelStoreServer.
func (s *Service) Push(stream rlhubv1.ModelStore_PushServer) error {
	info, err := s.push(stream)
	if err != nil {
		s.cfg.Logger.Debug("store: push refused", "err", err)
		return grpcerr.ToStatus(err)
	}
	s.cfg.Logger.Info("store: version landed", "model", info.Name, "version", info.Version, "epoch", info.Epoch, "bytes", info.Bytes)
	return stream.SendAndClose(&rlhubv1.StorePushResponse{Info: infoProto(info)})
}

func (s *Service) push(stream rlhubv1.ModelStore_PushServer) (store.Info, error) {
	ctx := stream.Context()
	// With the chunk codec (the client asked for it), chunk bytes stay in
	// gRPC's buffers until copied into the assembler; otherwise the stock
	// codec decodes each message and it is wrapped.
	recv := chunkcodec.Receiver[*rlhubv1.StorePushRequest](stream.RecvMsg, chunkcodec.Requested(ctx))
	var msg chunkcodec.Msg[*rlhubv1.StorePushRequest]
	defer msg.Release()
	err := recv(&msg)
	if err == io.EOF {
		return store.Info{}, fmt.Errorf("%w: push stream ended before its header", errs.ErrInvalid)
	}
	if err != nil {
		return store.Info{}, err
	}
	hdr := msg.Msg.GetHeader()
	return s.pushBody(ctx, hdr, func(asm *wire.Assembler) error {
		for {
			err := recv(&msg)
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if !msg.Held() {
				return fmt.Errorf("%w: model %s: a header or an empty message after %d bytes", errs.ErrInvalid, errs.Quote(hdr.Blob.Model), asm.Received())
			}
			if err := msg.WriteChunk(asm.Write); err != nil {
				return fmt.Errorf("model %s: %w", errs.Quote(hdr.Blob.Model), err)
			}
		}
	})
}

// pushBody runs one push, over gRPC or the data plane, from its header:
// it checks what the header alone decides — ownership and the token's
// quota (store rule 6), the store's size limit — before any body byte is
// read, then has body receive the blob into an assembler bounded by the
// announced size, and pushes the whole blob to the store.
func (s *Service) pushBody(ctx context.Context, hdr *rlhubv1.StorePushHeader, body func(*wire.Assembler) error) (store.Info, error) {
	if hdr == nil || hdr.Blob == nil {
		return store.Info{}, fmt.Errorf("%w: a push must start with a header carrying BlobInfo", errs.ErrInvalid)
	}
	b := hdr.Blob
	if !hdr.ExpectAny && hdr.Expect > store.MaxVersion {
		// The Go API's ExpectAny is 2^64-1: taken as it came, a client's
		// expect of 2^64-1 (a compare-and-set no model can pass) let the
		// push land unchecked.
		return store.Info{}, fmt.Errorf("%w: model %s: expect %d is past the largest version 2^62", errs.ErrInvalid, errs.Quote(b.Model), hdr.Expect)
	}
	req := store.PushRequest{Name: b.Model, Version: b.Version, Epoch: b.Epoch}
	if p, ok := auth.FromContext(ctx); ok {
		req.Owner, req.Claim, req.Admin = p.Owner(), true, p.Role >= auth.Admin
		if s.cfg.Auth != nil && p.Quota != (auth.Quota{}) {
			u, err := s.usage(ctx, req.Owner, b.Model)
			if err != nil {
				return store.Info{}, err
			}
			release, err := s.cfg.Auth.ReserveQuota(p, b.Model, int64(min(b.TotalBytes, 1<<62)), u)
			if err != nil {
				return store.Info{}, err
			}
			defer release()
		}
	}
	maxBytes := s.cfg.MaxModelBytes
	if p, ok := s.cfg.Store.(store.Prechecker); ok {
		if err := p.Precheck(b.Model, b.TotalBytes); err != nil {
			return store.Info{}, err
		}
		maxBytes = int64(min(b.TotalBytes, 1<<62)) // the store's limit decided
	}
	if b.TotalBytes <= uint64(maxBytes) { // a larger one fails in NewAssembler, holding nothing
		release, err := s.inFlight.Take(ctx, b.TotalBytes, "pushes")
		if err != nil {
			if ctx.Err() != nil {
				return store.Info{}, err
			}
			return store.Info{}, fmt.Errorf("model %s: %w (--max-push-bytes-in-flight)", errs.Quote(b.Model), err)
		}
		defer release()
	}
	asm, err := wire.NewAssembler(b.TotalBytes, wire.Limits{MaxBytes: maxBytes, MaxHeaderBytes: s.cfg.MaxHeaderBytes})
	if err != nil {
		return store.Info{}, fmt.Errorf("model %s: %w", errs.Quote(b.Model), err)
	}
	if err := body(asm); err != nil {
		return store.Info{}, err
	}
	_, blob, err := asm.Finish()
	if err != nil {
		return store.Info{}, fmt.Errorf("model %s: %w", errs.Quote(b.Model), err)
	}
	req.Expect, req.Blob = hdr.Expect, blob
	if hdr.ExpectAny {
		req.Expect = store.ExpectAny
	}
	if s.cfg.PushGuard != nil {
		release, err := s.cfg.PushGuard(ctx, b.Model, b.Life)
		if err != nil {
			return store.Info{}, err
		}
		defer release()
	}
	return s.cfg.Store.Push(ctx, req)
}

// usage is what owner holds in the store (its quota's measure): the
// models it owns, their newest versions' bytes, and model's share.
func (s *Service) usage(ctx context.Context, owner, model string) (auth.Usage, error) {
	if ur, ok := s.cfg.Store.(store.UsageReader); ok {
		var u auth.Usage
		u.Models, u.Bytes, u.Owns, u.ModelBytes = ur.OwnerUsage(owner, model)
		return u, nil
	}
	infos, err := s.cfg.Store.List(ctx)
	if err != nil {
		return auth.Usage{}, err
	}
	var u auth.Usage
	for _, in := range infos {
		if in.Owner != owner {
			continue
		}
		u.Models++
		u.Bytes += in.Bytes
		if in.Name == model {
			u.Owns, u.ModelBytes = true, in.Bytes
		}
	}
	return u, nil
}

// Pull implements ModelStoreServer.
func (s *Service) Pull(req *rlhubv1.StorePullRequest, stream rlhubv1.ModelStore_PullServer) error {
	ctx := stream.Context()
	if req.IfNewerThan != nil {
		if req.Version != 0 {
			return grpcerr.ToStatus(fmt.Errorf("%w: if_newer_than with an exact version %d", errs.ErrInvalid, req.Version))
		}
		snap, done, err := s.lend(ctx, req.Model, 0)
		if err != nil {
			return grpcerr.ToStatus(err)
		}
		defer done()
		if snap.Version <= *req.IfNewerThan {
			return stream.Send(&rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Header{Header: &rlhubv1.StorePullHeader{
				Blob:        &rlhubv1.BlobInfo{Model: snap.Name, Version: snap.Version, Epoch: snap.Epoch, Life: snap.Life()},
				NotModified: true,
			}}})
		}
		return s.send(stream, snap, 0, req.ChunkBytes)
	}
	snap, done, err := s.lend(ctx, req.Model, req.Version)
	if err != nil {
		return grpcerr.ToStatus(err)
	}
	defer done()
	return s.send(stream, snap, 0, req.ChunkBytes)
}

// lend gets a version for a stream to send: borrowed from the store
// (store.Borrow) and lent on to the chunk codec, so that a store that lends
// gets it back only when gRPC has written the bytes. Pulling a version
// then does not keep its writer (the reducer) from reusing the blob once
// the store drops it. done ends the loan: call it once the stream sends
// nothing more from the snapshot.
func (s *Service) lend(ctx context.Context, model string, version uint64) (*store.Snapshot, func(), error) {
	snap, release, err := store.Borrow(ctx, s.cfg.Store, model, version)
	if err != nil {
		return nil, nil, err
	}
	return snap, chunkcodec.Lend(snap.Blob, release), nil
}

// lendNewerLife is lend for WaitNewer, following lives when life is not 0
// (store.BorrowNewerLife).
func (s *Service) lendNewerLife(ctx context.Context, model string, after, life uint64) (*store.Snapshot, func(), error) {
	snap, release, err := store.BorrowNewerLife(ctx, s.cfg.Store, model, after, life)
	if err != nil {
		return nil, nil, err
	}
	return snap, chunkcodec.Lend(snap.Blob, release), nil
}

// Watch implements ModelStoreServer.
func (s *Service) Watch(req *rlhubv1.StoreWatchRequest, stream rlhubv1.ModelStore_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	stop := context.AfterFunc(s.drainCtx, cancel)
	defer stop()
	after := req.After
	// life is the life of the version after names when the watch follows
	// lives (0: unknown, or not following: versions only grow).
	life := uint64(0)
	if req.FollowLives {
		life = req.Life
	}
	var skips store.Skips
	for {
		snap, done, err := s.lendNewerLife(ctx, req.Model, after, life)
		if err != nil {
			if s.drainCtx.Err() != nil && stream.Context().Err() == nil {
				err = errDraining
			}
			return grpcerr.ToStatus(err)
		}
		err = s.send(stream, snap, skips.Next(snap), req.ChunkBytes)
		done()
		if err != nil {
			return err
		}
		after = snap.Version
		if req.FollowLives {
			life = snap.Life()
		}
	}
}

type pullStream interface {
	Send(*rlhubv1.StorePullResponse) error
}

// send streams one whole version: its header, then slices of snap.Blob.
func (s *Service) send(stream pullStream, snap *store.Snapshot, skipped uint64, chunkBytes uint32) error {
	chunk := s.cfg.ChunkBytes
	if chunkBytes > 0 && int(chunkBytes) < chunk {
		chunk = max(int(chunkBytes), 1024)
	}
	err := stream.Send(&rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Header{Header: &rlhubv1.StorePullHeader{
		Blob: &rlhubv1.BlobInfo{
			Model:      snap.Name,
			Version:    snap.Version,
			Epoch:      snap.Epoch,
			TotalBytes: uint64(len(snap.Blob)),
			ChunkBytes: uint32(chunk),
			Life:       snap.Life(),
		},
		Skipped:         skipped,
		Metadata:        snap.Metadata,
		CreatedUnixNano: snap.Created.UnixNano(),
	}}})
	if err != nil {
		return err
	}
	return wire.ChunksOf(snap.Blob, chunk, func(b []byte) error {
		return stream.Send(&rlhubv1.StorePullResponse{Body: &rlhubv1.StorePullResponse_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}})
	})
}

// List paging: a page holds at most the asked page_size models (0 means
// listPageDefault; more is cut to listPageMax) and at most listPageBytes
// of encoded models (one at least), well under gRPC's 4 MiB message
// limit whatever the models' names and retained lists. Before paging, one
// response held every model and a store past about 30k models could not
// be listed at all.
const (
	listPageDefault = 1000
	listPageMax     = 1000
	listPageBytes   = 2 << 20
	// maxPageTokenBytes bounds a page token: it carries the last name
	// sent (base64), so names up to 12 KiB page (the store's default
	// bound is 128 bytes).
	maxPageTokenBytes = 16 << 10
)

// pageTokenPrefix marks the token format: the prefix, then the last model
// name sent, unpadded URL-safe base64. Clients treat it as opaque.
const pageTokenPrefix = "n1."

func pageToken(lastName string) string {
	return pageTokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(lastName))
}

// parsePageToken returns the name a page token starts after ("" for the
// first page). Its errors never quote the token.
func parsePageToken(tok string) (string, error) {
	if tok == "" {
		return "", nil
	}
	if len(tok) > maxPageTokenBytes {
		return "", fmt.Errorf("%w: page_token of %d bytes exceeds the limit of %d", errs.ErrInvalid, len(tok), maxPageTokenBytes)
	}
	rest, ok := strings.CutPrefix(tok, pageTokenPrefix)
	if !ok {
		return "", fmt.Errorf("%w: page_token of %d bytes is not a List token of this hub", errs.ErrInvalid, len(tok))
	}
	name, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || len(name) == 0 {
		return "", fmt.Errorf("%w: page_token of %d bytes is not a List token of this hub", errs.ErrInvalid, len(tok))
	}
	return string(name), nil
}

// List implements ModelStoreServer: one page of the models, sorted by
// name, starting after the model the page token names (which may since
// have been deleted).
func (s *Service) List(ctx context.Context, req *rlhubv1.StoreListRequest) (*rlhubv1.StoreListResponse, error) {
	after, err := parsePageToken(req.GetPageToken())
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	size := int(req.GetPageSize())
	if size == 0 {
		size = listPageDefault
	}
	size = min(size, listPageMax)
	infos, err := s.cfg.Store.List(ctx)
	if err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	i := 0
	if after != "" {
		i = sort.Search(len(infos), func(i int) bool { return infos[i].Name > after })
	}
	out := &rlhubv1.StoreListResponse{}
	used := 0
	for ; i < len(infos) && len(out.Models) < size; i++ {
		m := infoProto(infos[i])
		n := protowire.SizeTag(1) + protowire.SizeBytes(proto.Size(m))
		if len(out.Models) > 0 && used+n > listPageBytes {
			break
		}
		out.Models = append(out.Models, m)
		used += n
	}
	if i < len(infos) {
		out.NextPageToken = pageToken(infos[i-1].Name)
	}
	return out, nil
}

func infoProto(in store.Info) *rlhubv1.StoreModelInfo {
	return &rlhubv1.StoreModelInfo{
		Name:            in.Name,
		Version:         in.Version,
		Epoch:           in.Epoch,
		Bytes:           uint64(in.Bytes),
		CreatedUnixNano: in.Created.UnixNano(),
		Retained:        in.Retained,
		Owner:           in.Owner,
	}
}

// Delete implements ModelStoreServer: store.Deleter.Delete on the hub's
// store (Unimplemented when it cannot delete).
//
// TODO(sec-auth): Delete is an administrator's operation; the role table
// must allow it to the admin role only.
func (s *Service) Delete(ctx context.Context, req *rlhubv1.StoreDeleteRequest) (*rlhubv1.StoreDeleteResponse, error) {
	d, ok := s.cfg.Store.(store.Deleter)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this hub's store cannot delete models")
	}
	if err := d.Delete(ctx, req.GetModel()); err != nil {
		return nil, grpcerr.ToStatus(err)
	}
	s.cfg.Logger.Info("store: model deleted", "model", req.GetModel())
	if s.cfg.Deleted != nil {
		s.cfg.Deleted(ctx, req.GetModel())
	}
	return &rlhubv1.StoreDeleteResponse{}, nil
}
