package replica

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlhub/rlhub/internal/errs"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

// The replication stream is one bidirectional gRPC stream,
// /rlhub.v1.Replica/Follow (proto/rlhub/v1/replica.proto), whose messages
// are google.protobuf.BytesValue frames: the frames are this package's,
// and only hubs of one build speak them. The first byte
// of a frame is its kind:
//
//	follower → primary:  H hello (JSON), then A ack (uvarint unit)
//	new primary → standby: H hello with query set; the standby answers
//	                     P position (JSON) and ends the stream
//	primary → follower:  B begin unit (JSON), then per file
//	                     F path + size, then the file's bytes as data
//	                     frames (raw: no kind byte; size bytes in all),
//	                     G append: path + size + from, then the file's
//	                     bytes from that offset as data frames (size -
//	                     from bytes): the follower's file holds the
//	                     first from bytes (only to a follower whose hello
//	                     set appends),
//	                     K keep path (full sync: you hold it already),
//	                     X delete path, then E end (uvarint unit)
//
// Data frames carry no kind byte so that the primary sends a file's bytes
// from where they lie (a version the store holds in memory) without
// copying them into frames; the F frame's size says how many follow.
const (
	kindHello  = 'H'
	kindAck    = 'A'
	kindBegin  = 'B'
	kindFile   = 'F'
	kindAppend = 'G'
	kindKeep   = 'K'
	kindDelete = 'X'
	kindEnd    = 'E'
	kindPos    = 'P'
)

// ServiceName and FollowMethod name the replication stream.
const (
	ServiceName  = "rlhub.v1.Replica"
	FollowMethod = rlhubv1.Replica_Follow_FullMethodName
)

// chunkBytes bounds one data frame (the hub's messages are ≤ 4 MiB).
const chunkBytes = 1 << 20

// maxControlBytes bounds a hello or begin frame.
const maxControlBytes = 16 << 20

type hello struct {
	// Member is the follower's member id (what the primary counts acks by).
	Member string `json:"member"`
	// Epoch is the term the follower believes the primary holds.
	Epoch uint64 `json:"epoch"`
	// Have lists the follower's immutable files and their sizes.
	Have map[string]int64 `json:"have"`
	// Query asks a standby for its position instead of following.
	Query bool `json:"query,omitempty"`
	// Dirs are the top directories the follower mirrors (its build's
	// mirroredDirs). A build that sends none mirrors legacyDirs, and
	// refuses a unit naming a path elsewhere: the primary leaves such
	// paths out of its stream (legacyFilter).
	Dirs []string `json:"dirs,omitempty"`
	// Appends says the follower takes G frames (an append-only file's new
	// bytes); the primary sends a follower without it whole files.
	Appends bool `json:"appends,omitempty"`
	// Term is the epoch of the primary the follower's newest unit came
	// from (its position's); 0 for none, or an older build. Led is the
	// newest term the follower led itself (Follower.Lead); 0 for none, or
	// an older build. A full sync keeps a file the follower holds at the
	// primary's size only when the follower already took a unit of the
	// primary's term, or its copy is of the primary's lineage (the newer
	// of Term and Led) and the primary did not write the file in its own
	// term (Source.cut).
	Term uint64 `json:"term,omitempty"`
	Led  uint64 `json:"led,omitempty"`
}

// position is how far a standby's copy has come: the epoch of the
// primary its newest unit came from and that unit's number (a term's
// units only grow, and a publish is acknowledged by the unit numbers at
// or above the one it asked for, so a copy at a larger (Epoch, Unit) holds
// every publish a smaller one holds). Campaigning: it may be elected.
type position struct {
	Epoch       uint64 `json:"epoch"`
	Unit        uint64 `json:"unit"`
	Campaigning bool   `json:"campaigning"`
}

// ahead reports whether p holds publishes q may not.
func (p position) ahead(q position) bool {
	return p.Epoch > q.Epoch || p.Epoch == q.Epoch && p.Unit > q.Unit
}

type begin struct {
	Unit uint64 `json:"unit"`
	Full bool   `json:"full"`
	// Epoch is the primary's term, checked again by the follower.
	Epoch uint64 `json:"epoch"`
}

var streamDesc = grpc.StreamDesc{StreamName: "Follow", ServerStreams: true, ClientStreams: true}

func frame(kind byte, payload ...[]byte) *wrapperspb.BytesValue {
	n := 1
	for _, p := range payload {
		n += len(p)
	}
	b := make([]byte, 1, n)
	b[0] = kind
	for _, p := range payload {
		b = append(b, p...)
	}
	return &wrapperspb.BytesValue{Value: b}
}

func jsonFrame(kind byte, v any) *wrapperspb.BytesValue {
	b, _ := json.Marshal(v)
	return frame(kind, b)
}

func uvarintFrame(kind byte, n uint64) *wrapperspb.BytesValue {
	return frame(kind, binary.AppendUvarint(nil, n))
}

func pathFrame(kind byte, rel string, size int64) *wrapperspb.BytesValue {
	return frame(kind, pathBytes(rel, size, kind == kindFile))
}

// pathBytes is a path frame's payload: the path and, when sized, the
// file's size.
func pathBytes(rel string, size int64, sized bool) []byte {
	b := binary.AppendUvarint(nil, uint64(len(rel)))
	b = append(b, rel...)
	if sized {
		b = binary.AppendUvarint(b, uint64(size))
	}
	return b
}

// appendFrame is a G frame: rel grows from from bytes to size.
func appendFrame(rel string, size, from int64) *wrapperspb.BytesValue {
	return frame(kindAppend, binary.AppendUvarint(pathBytes(rel, size, true), uint64(from)))
}

// parseAppend reads a G frame's payload: the path, the size the file
// grows to, and the offset its new bytes start at (0 < from < size).
func parseAppend(b []byte) (rel string, size, from int64, err error) {
	rel, size, rest, err := readPath(b, true)
	if err != nil {
		return "", 0, 0, err
	}
	fr, rest, err := parseUvarint(rest)
	if err != nil || fr == 0 || fr >= uint64(size) || len(rest) != 0 {
		return "", 0, 0, errFrame
	}
	if err := safeRel(rel); err != nil {
		return "", 0, 0, err
	}
	return rel, size, int64(fr), nil
}

var errFrame = errors.New("replica: malformed frame")

func parseUvarint(b []byte) (uint64, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return 0, nil, errFrame
	}
	return n, b[k:], nil
}

// parsePath reads a path (and, for F, a size) frame's payload.
func parsePath(kind byte, b []byte) (string, int64, error) {
	rel, size, rest, err := readPath(b, kind == kindFile)
	if err != nil {
		return "", 0, err
	}
	if len(rest) != 0 {
		return "", 0, errFrame
	}
	if err := safeRel(rel); err != nil {
		return "", 0, err
	}
	return rel, size, nil
}

// readPath reads what pathBytes wrote (the size at most 1 TiB; the
// caller checks the path: safeRel) and returns what follows it.
func readPath(b []byte, sized bool) (rel string, size int64, rest []byte, err error) {
	n, rest, err := parseUvarint(b)
	if err != nil || n > uint64(len(rest)) {
		return "", 0, nil, errFrame
	}
	rel, rest = string(rest[:n]), rest[n:]
	var sz uint64
	if sized {
		if sz, rest, err = parseUvarint(rest); err != nil || sz > 1<<40 {
			return "", 0, nil, errFrame
		}
	}
	return rel, int64(sz), rest, nil
}

func parseJSON(b []byte, v any) error {
	if len(b) > maxControlBytes {
		return fmt.Errorf("replica: control frame of %d bytes", len(b))
	}
	if err := json.Unmarshal(b, v); err != nil {
		// encoding/json's text can quote the input (a number it cannot
		// store, 1 MiB of digits): bounded, as any client's text is.
		return fmt.Errorf("%w: %d bytes of JSON that do not parse: %s", errFrame, len(b), errs.Quote(err.Error()))
	}
	return nil
}

// legacyFilter is the stream to a follower of an older build, which
// mirrors legacyDirs only and fails a unit naming another path ("path
// outside the mirrored directories"): it drops the file, keep and delete
// frames of such paths, with a dropped file's data frames. Without it a
// rolling upgrade could not be rolled back once a newer primary wrote
// state elsewhere (the aggregator's task). Only such a follower's stream
// pays for the parse.
type legacyFilter struct {
	frameStream
	left int64 // data bytes of the current file still to come
	drop bool  // the current file's data frames are dropped
}

func (l *legacyFilter) SendMsg(m any) error {
	var b []byte
	switch v := m.(type) {
	case *wrapperspb.BytesValue:
		b = v.GetValue()
	case *dataOut:
		b = v.b
	}
	if l.left > 0 { // a data frame: no kind byte
		l.left -= int64(len(b))
		if l.drop {
			return nil
		}
		return l.frameStream.SendMsg(m)
	}
	if len(b) > 0 && (b[0] == kindFile || b[0] == kindKeep || b[0] == kindDelete) {
		rel, size, err := parsePath(b[0], b[1:])
		if err != nil {
			return err
		}
		top, _, _ := strings.Cut(rel, string(filepath.Separator))
		l.left, l.drop = size, !slices.Contains(legacyDirs, top)
		if l.drop {
			return nil
		}
	}
	return l.frameStream.SendMsg(m)
}
