package storerpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/wire"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	"github.com/rlhub/rlhub/internal/wire/chunkcodec"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// ClientConfig configures a client.
type ClientConfig struct {
	// Addr is the hub's address ("127.0.0.1:7470"); used when Conn is nil.
	Addr string
	// Dial is how to connect to Addr (TLS, token); the zero value is
	// plaintext.
	Dial dial.Config
	// Conn, when set, is used instead of dialing Addr; the caller keeps
	// ownership and Close leaves it open.
	Conn grpc.ClientConnInterface
	// CallTimeout bounds a call whose context has no deadline; 0 means 2
	// minutes. Watch is exempt (it runs until its context ends).
	CallTimeout time.Duration
	// MaxAttempts bounds tries of a call that fails with Unavailable; 0
	// means 5; 1 disables retries.
	MaxAttempts int
	// BaseBackoff is the first retry's delay, doubled on each retry up to
	// MaxBackoff, each multiplied by a random factor in [0.5, 1.5); 0 means
	// 50ms and 2s.
	BaseBackoff, MaxBackoff time.Duration
	// Rand supplies backoff jitter; nil means a generator seeded from the
	// runtime.
	Rand *rand.Rand
	// ChunkBytes is the largest chunk sent or asked for; 0 means
	// wire.DefaultChunkBytes.
	ChunkBytes int
	// MaxModelBytes bounds a pulled blob; 0 means 4 GiB.
	MaxModelBytes int64
	// Transport is "" (or "auto"): pushes, pulls and WaitNewer on the hub's data
	// plane when Addr is dialed (Conn nil), gRPC otherwise and as the
	// fallback; "grpc": gRPC only. Watch, List and Delete always use gRPC.
	Transport string
	// StockCodec makes the client use gRPC's stock proto codec, as clients
	// in other languages do, instead of the chunk codec (for interop tests and to
	// measure what chunkcodec saves). The bytes on the wire are the same.
	StockCodec bool
}

func (c *ClientConfig) validate() error {
	if c.Conn == nil && c.Addr == "" {
		return errors.New("storerpc: ClientConfig needs Addr or Conn")
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = 2 * time.Minute
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.BaseBackoff == 0 {
		c.BaseBackoff = 50 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 2 * time.Second
	}
	if c.CallTimeout < 0 || c.MaxAttempts < 0 || c.BaseBackoff < 0 || c.MaxBackoff < c.BaseBackoff {
		return fmt.Errorf("storerpc: nonsense timing %v/%d/%v/%v", c.CallTimeout, c.MaxAttempts, c.BaseBackoff, c.MaxBackoff)
	}
	if c.Rand == nil {
		c.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = wire.DefaultChunkBytes
	}
	if c.ChunkBytes < 1024 {
		return fmt.Errorf("storerpc: ChunkBytes %d is below 1 KiB", c.ChunkBytes)
	}
	if c.MaxModelBytes == 0 {
		c.MaxModelBytes = 4 << 30
	}
	switch c.Transport {
	case "", "auto", "grpc":
	default:
		return fmt.Errorf("storerpc: Transport %q: want auto or grpc", c.Transport)
	}
	return nil
}

// The client dials with dial.Config's options: message limits of 16 MiB
// (above the 1 MiB chunks) and the chunk codec's buffer pool that does not
// zero. Flow-control windows and buffer sizes are gRPC's defaults: none of
// the alternatives measured better on loopback (docs/benchlog/2026-11-30-sessions-1-4.md, model
// store).

// Client talks to one hub's model store. Safe for concurrent use.
type Client struct {
	cfg  ClientConfig
	cc   grpc.ClientConnInterface
	rpc  rlhubv1.ModelStoreClient
	conn *grpc.ClientConn // ours to close; nil when ClientConfig.Conn was given

	closeCtx context.Context // done once Close is called
	closeFn  context.CancelFunc
	once     sync.Once

	randMu sync.Mutex // guards cfg.Rand

	bulk      *bulk.Client // the data plane; nil: gRPC only
	bulkMu    sync.Mutex   // guards bulkOffAt
	bulkOffAt time.Time    // when the hub answered UNIMPLEMENTED (gRPC for bulk.NotSupportedFor)
}

var _ store.Store = (*Client)(nil)

// NewClient returns a client. Dialing is lazy: NewClient does not wait for the hub.
func NewClient(cfg ClientConfig) (*Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg}
	conn := cfg.Conn
	if conn == nil {
		cc, err := cfg.Dial.GRPC(cfg.Addr)
		if err != nil {
			return nil, fmt.Errorf("storerpc: dial %s: %w", cfg.Addr, err)
		}
		c.conn, conn = cc, cc
	}
	c.cc = conn
	c.rpc = rlhubv1.NewModelStoreClient(conn)
	if cfg.Conn == nil && cfg.Transport != "grpc" {
		c.bulk = cfg.Dial.Bulk()
	}
	c.closeCtx, c.closeFn = context.WithCancel(context.Background())
	return c, nil
}

var errClosed = fmt.Errorf("%w: store client is closed", errs.ErrUnavailable)

// Close ends every call in flight (they fail with errs.ErrUnavailable) and
// closes the connection if the client dialed it. Safe to call twice.
func (c *Client) Close() error {
	var err error
	c.once.Do(func() {
		c.closeFn()
		if c.bulk != nil {
			c.bulk.Close()
		}
		if c.conn != nil {
			err = c.conn.Close()
		}
	})
	return err
}

func (c *Client) closed() bool { return c.closeCtx.Err() != nil }

// callCtx derives the context of one call: ctx, also ended by Close, with
// ClientConfig.CallTimeout when ctx has no deadline (unless long is set);
// dial.CallTimedOut tells when that bound ended it.
func (c *Client) callCtx(ctx context.Context, long bool) (context.Context, context.CancelFunc) {
	timeout := c.cfg.CallTimeout
	if long {
		timeout = 0
	}
	return dial.CallContext(ctx, c.closeCtx, timeout)
}

// backoff returns the delay before retry number attempt (1 for the first).
func (c *Client) backoff(attempt int) time.Duration {
	d := c.cfg.BaseBackoff
	for i := 1; i < attempt && d < c.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, c.cfg.MaxBackoff)
	c.randMu.Lock()
	f := 0.5 + c.cfg.Rand.Float64()
	c.randMu.Unlock()
	return time.Duration(float64(d) * f)
}

// sleep waits d or until ctx ends; it reports whether the full d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// retryable reports whether err is worth another attempt.
// A data-plane call's broken connection is errs.ErrUnavailable without a
// gRPC status.
func retryable(err error) bool {
	return status.Code(err) == codes.Unavailable || errors.Is(err, errs.ErrUnavailable)
}

// do runs op under one call context, retrying on Unavailable, except an
// address that twice left a data-plane connect or handshake unanswered
// (bulk.Unanswered): the call then ends Unavailable saying so (on a
// cluster a push goes to gRPC, which waits for a primary), as the Python
// client does. It returns op's last error converted by errs.FromStatus.
func (c *Client) do(ctx context.Context, op func(ctx context.Context) error) error {
	ctx, cancel := c.callCtx(ctx, false)
	defer cancel()
	var unanswered bulk.Unanswered
	for attempt := 1; ; attempt++ {
		err := op(ctx)
		if err == nil {
			return nil
		}
		if c.closed() {
			return errClosed
		}
		if gerr := unanswered.GiveUp(err); gerr != nil {
			return gerr
		}
		if !retryable(err) || attempt >= c.cfg.MaxAttempts || !sleep(ctx, c.backoff(attempt)) {
			if dial.CallTimedOut(ctx, err) {
				// A hub that accepts the connection and never answers
				// ends here, its error no clearer than "context
				// deadline exceeded": name what was waited for.
				return fmt.Errorf("storerpc: no answer from the hub within CallTimeout %v (the call's context had no deadline): %w", c.cfg.CallTimeout, grpcerr.FromStatus(err))
			}
			return grpcerr.FromStatus(err)
		}
	}
}

// Push implements store.Store: on the hub's data plane when it serves
// pushes there (req.Blob written once, with writev from its memory), else
// streamed over gRPC in chunks. req.Blob is only read.
func (c *Client) Push(ctx context.Context, req store.PushRequest) (store.Info, error) {
	hdr := &rlhubv1.StorePushHeader{
		Blob: &rlhubv1.BlobInfo{
			Model: req.Name, Version: req.Version, Epoch: req.Epoch,
			TotalBytes: uint64(len(req.Blob)), ChunkBytes: uint32(c.cfg.ChunkBytes),
		},
		Expect:    req.Expect,
		ExpectAny: req.Expect == store.ExpectAny,
	}
	if hdr.ExpectAny {
		hdr.Expect = 0
	}
	if info, err, ok := c.bulkPush(ctx, hdr, req.Blob); ok {
		return info, err
	}
	var info store.Info
	err := c.do(ctx, func(ctx context.Context) error {
		stream, err := c.rpc.Push(ctx, c.codecOpt())
		if err != nil {
			return err
		}
		err = stream.Send(&rlhubv1.StorePushRequest{Body: &rlhubv1.StorePushRequest_Header{Header: hdr}})
		if err == nil {
			err = wire.ChunksOf(req.Blob, c.cfg.ChunkBytes, func(b []byte) error {
				return stream.Send(&rlhubv1.StorePushRequest{Body: &rlhubv1.StorePushRequest_Chunk{Chunk: &rlhubv1.Chunk{Data: b}}})
			})
		}
		// io.EOF from Send means the server already answered; its status
		// comes from CloseAndRecv.
		if err != nil && err != io.EOF {
			return err
		}
		resp, err := stream.CloseAndRecv()
		if err != nil {
			return err
		}
		info = infoFromProto(resp.Info)
		return nil
	})
	return info, err
}

// Get implements store.Store by pulling; the returned snapshot is the
// caller's own copy (Seq is 0: unknown over the network).
func (c *Client) Get(ctx context.Context, name string, version uint64) (*store.Snapshot, error) {
	return c.GetInto(ctx, name, version, nil)
}

// GetIfNewer implements store.Store: (nil, nil) when the hub's newest is
// not newer than `than`, after a single small reply.
func (c *Client) GetIfNewer(ctx context.Context, name string, than uint64) (*store.Snapshot, error) {
	return c.GetIfNewerInto(ctx, name, than, nil)
}

// GetInto is Get receiving the blob into buf's memory instead of a fresh
// buffer, saving the allocation, zeroing and page faults of a new blob:
// for a caller that pulls version after version and is finished with an
// older snapshot, pass that snapshot's Blob.
//
// When cap(buf) holds the blob and buf starts 8-byte aligned (as every
// slice from make of 8 bytes or more and every Snapshot.Blob does), the
// returned snapshot's Blob is buf[:n] and its Tensors alias it; otherwise
// the blob is freshly allocated, as by Get, and buf is not written. Every
// check of Get applies unchanged (the size limit is decided from the
// announced size before buf is touched). On error there is no snapshot and
// buf's contents are unspecified: chunks received before the failure may
// have overwritten it, also across retried attempts.
//
// buf belongs to the call until it returns, and then to the returned
// snapshot: the caller must not write buf, or pass it to another pull,
// while it still uses a snapshot whose Blob aliases it — nor pass the Blob
// of a snapshot it still uses, since a failed pull may overwrite it too.
func (c *Client) GetInto(ctx context.Context, name string, version uint64, buf []byte) (*store.Snapshot, error) {
	snap, _, err := c.pull(ctx, &rlhubv1.StorePullRequest{Model: name, Version: version}, buf)
	return snap, err
}

// GetIfNewerInto is GetIfNewer receiving into buf, on the terms of
// GetInto. A "not modified" reply ((nil, nil)) leaves buf untouched.
func (c *Client) GetIfNewerInto(ctx context.Context, name string, than uint64, buf []byte) (*store.Snapshot, error) {
	snap, _, err := c.pull(ctx, &rlhubv1.StorePullRequest{Model: name, IfNewerThan: &than}, buf)
	return snap, err
}

// GetIfNewerLife is GetIfNewer following the model's lives
// (docs/weight-sync.md, "Lives"; wsync.StoreLifePoller): it also returns
// the newest version when it is of another life than life, the life of
// version than (0: unknown; versions only grow), though it is not newer —
// the model deleted and pushed again. The hub's "not modified" answer
// names its newest and that version's life; only when that life is known
// and not life is the newest pulled again whole, so a poll costs what
// GetIfNewer's does but on a change of life. The snapshot's Life is the
// one the hub named. A hub that predates lives answers as GetIfNewer.
func (c *Client) GetIfNewerLife(ctx context.Context, name string, than, life uint64) (*store.Snapshot, error) {
	snap, newest, err := c.pull(ctx, &rlhubv1.StorePullRequest{Model: name, IfNewerThan: &than}, nil)
	if err != nil || snap != nil || life == 0 || newest.GetLife() == 0 || newest.GetLife() == life {
		return snap, err
	}
	// Another life: its newest, whatever its number (asked for anew: the
	// model may have changed again since the answer).
	snap, _, err = c.pull(ctx, &rlhubv1.StorePullRequest{Model: name}, nil)
	if err != nil || snap.Version > than || (snap.Life() != 0 && snap.Life() != life) {
		return snap, err
	}
	return nil, nil // the newest is of life after all: not modified
}

// pull runs one Pull call, receiving into buf when it is usable (see
// GetInto); buf may be nil. A "not modified" answer is a nil snapshot
// with newest, the hub's newest version it names (its Life 0: a hub that
// predates lives; nil from a data plane that named none).
func (c *Client) pull(ctx context.Context, req *rlhubv1.StorePullRequest, buf []byte) (snap *store.Snapshot, newest *rlhubv1.BlobInfo, err error) {
	req.ChunkBytes = uint32(c.cfg.ChunkBytes)
	if s, nm, err, ok := c.bulkRead(ctx, bulkPullMethod, req, buf); ok {
		if err == nil && s != nil {
			err = answers(req.Model, req.Version, req.IfNewerThan, s)
		}
		if err != nil {
			return nil, nil, err
		}
		return s, nm, nil
	}
	err = c.do(ctx, func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // ends the stream once one version is in
		recv, err := c.openRaw(ctx, pullDesc, rlhubv1.ModelStore_Pull_FullMethodName, req)
		if err != nil {
			return err
		}
		snap, _, newest, err = c.recvVersion(recv, buf)
		return err
	})
	if err == nil && snap != nil {
		err = answers(req.Model, req.Version, req.IfNewerThan, snap)
	}
	if err != nil {
		return nil, nil, err
	}
	return snap, newest, nil
}

// answers checks that snap is what was asked for: model name, the version
// asked for (0: any), one newer than than (nil: any). A hub answering
// otherwise (a bug, or a hostile one) is refused, not delivered: a
// receiver would copy another model's weights, or a watch go backwards.
func answers(name string, version uint64, than *uint64, snap *store.Snapshot) error {
	switch {
	case snap.Name != name:
		return fmt.Errorf("%w: storerpc: asked for model %s, the hub answered %s", errs.ErrInvalid, errs.Quote(name), errs.Quote(snap.Name))
	case version != 0 && snap.Version != version:
		return fmt.Errorf("%w: storerpc: asked for model %s version %d, the hub answered version %d", errs.ErrInvalid, errs.Quote(name), version, snap.Version)
	case than != nil && snap.Version <= *than:
		return fmt.Errorf("%w: storerpc: asked for model %s newer than %d, the hub answered version %d", errs.ErrInvalid, errs.Quote(name), *than, snap.Version)
	}
	return nil
}

// pulled is one pull or watch response: a header, or a chunk still in
// gRPC's buffers.
type pulled = chunkcodec.Msg[*rlhubv1.StorePullResponse]

var (
	pullDesc  = &grpc.StreamDesc{StreamName: "Pull", ServerStreams: true}
	watchDesc = &grpc.StreamDesc{StreamName: "Watch", ServerStreams: true}
)

// openRaw opens a server stream whose responses are received with the
// blob codec (chunks stay in gRPC's buffers until copied once into the
// assembler) and returns its receive function.
func (c *Client) openRaw(ctx context.Context, desc *grpc.StreamDesc, method string, req any) (func(*pulled) error, error) {
	cs, err := c.cc.NewStream(ctx, desc, method, c.codecOpt())
	if err != nil {
		return nil, err
	}
	if err := cs.SendMsg(req); err != nil && err != io.EOF {
		return nil, err
	}
	if err := cs.CloseSend(); err != nil {
		return nil, err
	}
	return chunkcodec.Receiver[*rlhubv1.StorePullResponse](cs.RecvMsg, !c.cfg.StockCodec), nil
}

// codecOpt selects the codec of a call.
func (c *Client) codecOpt() grpc.CallOption {
	if c.cfg.StockCodec {
		return grpc.CallContentSubtype(grpcproto.Name)
	}
	return grpc.CallContentSubtype(chunkcodec.Name)
}

// recvVersion reads one version (header and chunks) from a pull or watch
// stream into buf when it can hold it (wire.NewAssemblerInto), else into
// fresh memory. A not-modified header yields a nil snapshot and the
// newest version it names.
func (c *Client) recvVersion(recv func(*pulled) error, buf []byte) (*store.Snapshot, uint64, *rlhubv1.BlobInfo, error) {
	var msg pulled
	defer msg.Release()
	if err := recv(&msg); err != nil {
		return nil, 0, nil, err
	}
	hdr := msg.Msg.GetHeader()
	if hdr == nil || hdr.Blob == nil {
		return nil, 0, nil, fmt.Errorf("storerpc: protocol: a version must start with a header carrying BlobInfo")
	}
	if hdr.NotModified {
		return nil, 0, hdr.Blob, nil
	}
	b := hdr.Blob
	asm, err := wire.NewAssemblerInto(buf, b.TotalBytes, wire.Limits{MaxBytes: c.cfg.MaxModelBytes})
	if err != nil {
		return nil, 0, nil, fmt.Errorf("storerpc: model %s version %d: %w", errs.Quote(b.Model), b.Version, err)
	}
	for uint64(asm.Received()) < b.TotalBytes {
		err := recv(&msg)
		if err == io.EOF {
			break // Finish reports the shortfall
		}
		if err != nil {
			return nil, 0, nil, err
		}
		if !msg.Held() {
			return nil, 0, nil, fmt.Errorf("storerpc: protocol: a header or an empty message inside model %s version %d", errs.Quote(b.Model), b.Version)
		}
		if err := msg.WriteChunk(asm.Write); err != nil {
			return nil, 0, nil, fmt.Errorf("storerpc: model %s version %d: %w", errs.Quote(b.Model), b.Version, err)
		}
	}
	f, blob, err := asm.Finish()
	if err != nil {
		return nil, 0, nil, fmt.Errorf("storerpc: model %s version %d: %w", errs.Quote(b.Model), b.Version, err)
	}
	return store.WithLife(&store.Snapshot{
		Name:     b.Model,
		Version:  b.Version,
		Epoch:    b.Epoch,
		Blob:     blob,
		Tensors:  f.Tensors,
		Metadata: f.Metadata,
		Created:  time.Unix(0, hdr.CreatedUnixNano),
	}, b.Life), hdr.Skipped, nil, nil
}

// WaitNewer implements store.Store with a watch that ends after its first
// version.
func (c *Client) WaitNewer(ctx context.Context, name string, after uint64) (*store.Snapshot, error) {
	return c.waitNewer(ctx, name, after, 0, false)
}

// WaitNewerLife is WaitNewer following the model's lives (docs/weight-sync.md,
// "Lives"): it also returns the newest version when it is of another life
// than life, the life of version after (0: unknown), though it is not
// newer — the model deleted and pushed again. The snapshot's Life is the
// one the hub named. A hub that predates lives answers as WaitNewer.
func (c *Client) WaitNewerLife(ctx context.Context, name string, after, life uint64) (*store.Snapshot, error) {
	return c.waitNewer(ctx, name, after, life, true)
}

func (c *Client) waitNewer(ctx context.Context, name string, after, life uint64, follow bool) (*store.Snapshot, error) {
	// On the data plane: long polls, each up to the hub's wait, until a
	// version newer than after (or of another life) arrives.
	for ctx.Err() == nil {
		snap, _, err, ok := c.bulkRead(ctx, bulkWatchMethod, &rlhubv1.StoreWatchRequest{Model: name, After: after, FollowLives: follow, Life: life}, nil)
		if !ok {
			break // gRPC below
		}
		if err != nil || snap != nil {
			return snap, err
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	var got *store.Snapshot
	err := c.watch(ctx, name, after, life, follow, func(s *store.Snapshot, _ uint64) error {
		got = s
		return errStop
	})
	if errors.Is(err, errStop) {
		return got, nil
	}
	return nil, err
}

var errStop = errors.New("stop watching")

// Watch delivers each new version of name newer than after to fn, in
// increasing version order, with how many versions the hub skipped since
// the previous delivery on the same stream (0 after a reconnect: unknown).
// It runs until ctx ends (returning ctx's error), fn returns an error
// (returned as is) or the hub fails with anything but Unavailable; on
// Unavailable it reconnects with backoff and resumes after the last
// delivered version. Watch has no default deadline.
func (c *Client) Watch(ctx context.Context, name string, after uint64, fn func(snap *store.Snapshot, skipped uint64) error) error {
	return c.watch(ctx, name, after, 0, false, fn)
}

// WatchLives is Watch following the model's lives (docs/weight-sync.md,
// "Lives"): once the model is deleted and pushed again, fn gets the new
// life's newest version at once, though it is not newer than the last one
// delivered (each snapshot's Life is the one the hub named; versions only
// grow within a life). life is the life of version after (0: unknown). A
// reconnect resumes after the last delivered version and its life; a hub
// restarted on its data, or another cluster primary, names the same lives
// (docs/store.md). A hub that predates lives answers as Watch.
func (c *Client) WatchLives(ctx context.Context, name string, after, life uint64, fn func(snap *store.Snapshot, skipped uint64) error) error {
	return c.watch(ctx, name, after, life, true, fn)
}

func (c *Client) watch(ctx context.Context, name string, after, life uint64, follow bool, fn func(snap *store.Snapshot, skipped uint64) error) error {
	ctx, cancel := c.callCtx(ctx, true)
	defer cancel()
	failures := 0
	pos := watchPos{after: after, life: life, follow: follow}
	for {
		err := c.watchOnce(ctx, name, &pos, &failures, fn)
		var ferr fnError
		if errors.As(err, &ferr) {
			return ferr.err
		}
		if c.closed() {
			return errClosed
		}
		if !retryable(err) || failures >= c.cfg.MaxAttempts || !sleep(ctx, c.backoff(failures)) {
			return grpcerr.FromStatus(err)
		}
	}
}

// fnError marks an error returned by a Watch callback.
type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

// watchPos is where a watch resumes: after the version it delivered last,
// of life (0: unknown); follow says it follows lives.
type watchPos struct {
	after, life uint64
	follow      bool
}

// watchOnce runs one watch stream. failures is reset by every delivered
// version and incremented when the stream fails.
func (c *Client) watchOnce(ctx context.Context, name string, pos *watchPos, failures *int, fn func(*store.Snapshot, uint64) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	recv, err := c.openRaw(ctx, watchDesc, rlhubv1.ModelStore_Watch_FullMethodName,
		&rlhubv1.StoreWatchRequest{Model: name, After: pos.after, ChunkBytes: uint32(c.cfg.ChunkBytes), FollowLives: pos.follow, Life: pos.life})
	if err != nil {
		*failures++
		return err
	}
	for {
		snap, skipped, _, err := c.recvVersion(recv, nil)
		if err == nil && snap == nil {
			err = fmt.Errorf("storerpc: protocol: not-modified header on a watch")
		}
		if err != nil {
			*failures++
			return err
		}
		than := &pos.after
		if pos.follow && store.OtherLife(snap.Life(), pos.life) {
			than = nil // a new life: versions start afresh
		}
		if err := answers(name, 0, than, snap); err != nil {
			return err // not retried: the same hub would answer the same
		}
		*failures = 0
		pos.after = snap.Version
		if pos.follow {
			pos.life = snap.Life()
		}
		if err := fn(snap, skipped); err != nil {
			return fnError{err}
		}
	}
}

// List implements store.Store: every model, sorted by name, asked of the
// hub a page at a time (each page retried on its own; CallTimeout bounds
// the whole). A hub whose pages do not move forward (the same token again,
// a token with an empty page, a page not after the previous one) fails the
// List rather than looping. A hub that predates paging answers with one
// page and no token.
func (c *Client) List(ctx context.Context) ([]store.Info, error) {
	ctx, cancel := c.callCtx(ctx, false)
	defer cancel()
	var out []store.Info
	token := ""
	for {
		var resp *rlhubv1.StoreListResponse
		err := c.do(ctx, func(ctx context.Context) error {
			r, err := c.rpc.List(ctx, &rlhubv1.StoreListRequest{PageToken: token})
			resp = r
			return err
		})
		if err != nil {
			return nil, err
		}
		if len(resp.Models) > 0 && len(out) > 0 && resp.Models[0].GetName() <= out[len(out)-1].Name {
			return nil, fmt.Errorf("storerpc: protocol: List page starting at %s does not follow model %s", errs.Quote(resp.Models[0].GetName()), errs.Quote(out[len(out)-1].Name))
		}
		for _, m := range resp.Models {
			out = append(out, infoFromProto(m))
		}
		next := resp.NextPageToken
		if next == "" {
			return out, nil
		}
		if next == token || len(resp.Models) == 0 {
			return nil, fmt.Errorf("storerpc: protocol: List page of %d models does not advance its page token", len(resp.Models))
		}
		token = next
	}
}

// Delete implements store.Deleter over the hub's Delete RPC. A retry
// after a lost reply of a Delete that landed fails with errs.ErrNotFound.
func (c *Client) Delete(ctx context.Context, name string) error {
	return c.do(ctx, func(ctx context.Context) error {
		_, err := c.rpc.Delete(ctx, &rlhubv1.StoreDeleteRequest{Model: name})
		return err
	})
}

var _ store.Deleter = (*Client)(nil)

func infoFromProto(m *rlhubv1.StoreModelInfo) store.Info {
	if m == nil {
		return store.Info{}
	}
	return store.Info{
		Name:     m.Name,
		Version:  m.Version,
		Epoch:    m.Epoch,
		Bytes:    int64(m.Bytes),
		Created:  time.Unix(0, m.CreatedUnixNano),
		Retained: m.Retained,
		Owner:    m.Owner,
	}
}
