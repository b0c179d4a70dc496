package storerpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/errs/grpcerr"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/store"
	"github.com/rlhub/rlhub/internal/tensor"
	"github.com/rlhub/rlhub/internal/wire/bulk"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// The client's names for the store's data-plane methods (bulk.go).
const (
	bulkPullMethod  = BulkPullMethod
	bulkWatchMethod = BulkWatchMethod
	bulkPushMethod  = BulkPushMethod
)

// bulkAddr is where the data plane dials: Addr itself, or the primary a
// cluster target (a hub list, etcd://…) follows now; false while a
// cluster target knows no primary yet (gRPC then waits for one).
func (c *Client) bulkAddr() (string, bool) {
	if c.conn == nil {
		return c.cfg.Addr, true
	}
	return dial.PlaneAddr(c.conn, c.cfg.Addr)
}

// useBulk reports whether the data plane is worth trying now.
func (c *Client) useBulk() bool {
	addr, ok := c.bulkAddr()
	if c.bulk == nil || !ok || !c.bulk.Supported(addr) {
		return false
	}
	c.bulkMu.Lock()
	defer c.bulkMu.Unlock()
	return c.bulkOffAt.IsZero() || time.Since(c.bulkOffAt) > bulk.NotSupportedFor
}

// bulkPush runs one push on the data plane, with the retries of do (as
// over gRPC: a push whose connection broke may have landed, and its retry
// is then refused as not newer). ok is false when the caller should push
// over gRPC instead: the data plane is off; the hub does not serve pushes
// there (it refused the method before any body byte was sent); or, on a
// cluster target, the tries ended unavailable — the primary is changing,
// and a gRPC call waits for the next one within its deadline where the
// data plane can only try again.
func (c *Client) bulkPush(ctx context.Context, hdr *rlhubv1.StorePushHeader, blob []byte) (info store.Info, err error, ok bool) {
	if !c.useBulk() {
		return store.Info{}, nil, false
	}
	noBulk, err := c.bulkCall(ctx, func(ctx context.Context, addr string) error {
		var resp rlhubv1.StorePushResponse
		if err := c.bulk.Call(ctx, addr, bulkPushMethod, hdr, net.Buffers{blob}, &resp); err != nil {
			return err
		}
		info = infoFromProto(resp.Info)
		return nil
	})
	if noBulk || (err != nil && retryable(err) && ctx.Err() == nil && dial.IsCluster(c.cfg.Addr)) {
		return store.Info{}, nil, false
	}
	return info, err, true
}

// bulkCall runs call, one data-plane request to the primary's address,
// under do's retries: it follows a cluster's primary before each retry,
// and reports noBulk (and turns the data plane off for
// bulk.NotSupportedFor) when the hub does not serve the method there.
func (c *Client) bulkCall(ctx context.Context, call func(ctx context.Context, addr string) error) (noBulk bool, err error) {
	err = c.do(ctx, func(ctx context.Context) error {
		addr, ok := c.bulkAddr()
		if !ok { // the primary went away since useBulk: retried as Unavailable
			return fmt.Errorf("%w: storerpc: no primary known for %s yet", errs.ErrUnavailable, errs.Quote(c.cfg.Addr))
		}
		// Given up at once if the primary moves away meanwhile (its
		// machine may be gone without a word).
		pctx, planeDone := dial.PlaneContext(c.conn, ctx)
		err := planeDone(call(pctx, addr))
		if err != nil {
			if errors.Is(err, bulk.ErrNotSupported) || grpcerr.Code(err) == codes.Unimplemented {
				noBulk = true
				return nil
			}
			if c.conn != nil && retryable(err) {
				dial.PlaneFailed(c.conn, err) // a standby or a dead primary: follow before the retry
			}
		}
		return err
	})
	if noBulk {
		c.bulkMu.Lock()
		c.bulkOffAt = time.Now()
		c.bulkMu.Unlock()
	}
	return noBulk, err
}

// bulkRead runs one pull or watch request on the data plane, with the
// retries of do, receiving the version into buf when it holds it (8-byte
// aligned, as GetInto says) or into fresh aligned memory. ok is false when
// the data plane is off or the hub does not serve the method (the caller
// uses gRPC); a "not modified" answer is a nil snapshot with newest, the
// hub's newest version it names (nil when it names none). The snapshot is
// returned only after the hub's final status was OK and the bytes parsed
// as valid safetensors.
func (c *Client) bulkRead(ctx context.Context, method string, req proto.Message, buf []byte) (snap *store.Snapshot, newest *rlhubv1.BlobInfo, err error, ok bool) {
	if !c.useBulk() {
		return nil, nil, nil, false
	}
	noBulk, err := c.bulkCall(ctx, func(ctx context.Context, addr string) error {
		var hdr rlhubv1.StorePullHeader
		var blob []byte
		err := c.bulk.CallRecv(ctx, addr, method, req, nil, func(hb []byte, n int64, body io.Reader) error {
			if err := proto.Unmarshal(hb, &hdr); err != nil {
				return fmt.Errorf("%w: storerpc: pull header: %v", errs.ErrInvalid, err)
			}
			if hdr.NotModified {
				if n != 0 {
					return fmt.Errorf("%w: storerpc: a not-modified answer with %d body bytes", errs.ErrInvalid, n)
				}
				return nil
			}
			b := hdr.GetBlob()
			switch {
			case uint64(n) != b.GetTotalBytes():
				return fmt.Errorf("%w: storerpc: %d bytes for a %d-byte version", errs.ErrInvalid, n, b.GetTotalBytes())
			case n > c.cfg.MaxModelBytes:
				return fmt.Errorf("%w: storerpc: model %s version %d: %d bytes exceed the client's limit of %d",
					errs.ErrFull, errs.Quote(b.GetModel()), b.GetVersion(), n, c.cfg.MaxModelBytes)
			case n < 10:
				return fmt.Errorf("%w: storerpc: a version of %d bytes", errs.ErrInvalid, n)
			}
			if int64(cap(buf)) >= n && tensor.Aligned(buf) {
				blob = buf[:n]
			} else {
				blob = tensor.AlignedBytes(int(n))
			}
			_, err := io.ReadFull(body, blob)
			return err
		}, nil)
		if err != nil {
			return err
		}
		if hdr.NotModified || blob == nil {
			snap, newest = nil, hdr.GetBlob()
			return nil
		}
		b := hdr.GetBlob()
		f, err := safetensors.Decode(blob)
		if err != nil {
			return fmt.Errorf("storerpc: model %s version %d: %w", errs.Quote(b.GetModel()), b.GetVersion(), err)
		}
		snap = store.WithLife(&store.Snapshot{Name: b.GetModel(), Version: b.GetVersion(), Epoch: b.GetEpoch(), Blob: blob,
			Tensors: f.Tensors, Metadata: f.Metadata, Created: time.Unix(0, hdr.CreatedUnixNano)}, b.GetLife())
		return nil
	})
	if noBulk {
		return nil, nil, nil, false
	}
	return snap, newest, err, true
}
