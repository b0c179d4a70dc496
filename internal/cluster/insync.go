package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rlhub/rlhub/internal/errs"
)

// InSync records which members hold every publish acknowledged, with
// replication acknowledged by every standby: a primary writes itself and
// the members listed already at the start of its term (nothing is
// acknowledged in it yet), then, as standbys catch up or drop out, the
// members whose copies have everything acknowledged — a member is dropped
// before a publish it lacks is acknowledged. Only a member it lists may serve as primary, so a standby
// that was down while the primary went on without it never takes over
// with a copy that lacks acknowledged publishes (docs/cluster.md, "Who may
// take over"). No record (a new cluster, or acks other than all) lets any
// member serve.
type InSync struct {
	// Epoch is the term that wrote the record.
	Epoch   uint64   `json:"epoch"`
	Members []string `json:"members"`
}

// Has reports whether id is listed.
func (r *InSync) Has(id string) bool { return slices.Contains(r.Members, id) }

func inSyncKey(cfg *Config) string { return path.Join(cfg.prefix(), "insync") }

// RecordInSync writes the in-sync record for this term, if the term still
// holds (ErrDeposed otherwise); members nil deletes it.
func (t *Term) RecordInSync(ctx context.Context, members []string) error {
	key := inSyncKey(&t.m.cfg)
	op := clientv3.OpDelete(key)
	if members != nil {
		val, _ := json.Marshal(InSync{Epoch: t.Epoch, Members: members})
		op = clientv3.OpPut(key, string(val))
	}
	return t.m.k.do(ctx, func(ctx context.Context, c conn) error {
		resp, err := c.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(t.key), "=", int64(t.Epoch))).Then(op).Commit()
		if err != nil {
			return fmt.Errorf("%w: cluster: etcd: %v", errs.ErrUnavailable, err)
		}
		if !resp.Succeeded {
			return ErrDeposed
		}
		return nil
	})
}

// InSync reads the in-sync record (nil: none).
func (m *Member) InSync(ctx context.Context) (*InSync, error) {
	var r *InSync
	err := m.k.do(ctx, func(ctx context.Context, c conn) error {
		var err error
		r, err = readInSync(ctx, c.kv, &m.cfg)
		return err
	})
	return r, err
}

func readInSync(ctx context.Context, kv clientv3.KV, cfg *Config) (*InSync, error) {
	resp, err := kv.Get(ctx, inSyncKey(cfg))
	if err != nil {
		return nil, etcdError(nil, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	var r InSync
	if err := json.Unmarshal(resp.Kvs[0].Value, &r); err != nil {
		return nil, fmt.Errorf("%w: cluster: the in-sync record is not JSON: %v", errs.ErrInvalid, err)
	}
	return &r, nil
}

// ForgetInSync deletes the in-sync record, so that any member may be
// elected: an operator's answer when every member it lists is gone for
// good, accepting the loss of what only they held. It returns the record
// it deleted (nil: there was none).
func ForgetInSync(ctx context.Context, cfg Config) (*InSync, error) {
	if err := cfg.validate(false); err != nil {
		return nil, err
	}
	cli, _, err := dial(&cfg)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	resp, err := cli.Delete(ctx, inSyncKey(&cfg), clientv3.WithPrevKV())
	if err != nil {
		return nil, etcdError(nil, err)
	}
	if len(resp.PrevKvs) == 0 {
		return nil, nil
	}
	var r InSync
	if err := json.Unmarshal(resp.PrevKvs[0].Value, &r); err != nil {
		return &InSync{}, nil
	}
	return &r, nil
}
