package replica

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/rlhub/rlhub/internal/testkit"
)

// framesStream is a unitStream over frames given in advance: control
// frames (kind first) and data frames (marked by data).
type framesStream struct {
	frames [][]byte
	data   map[int]bool
	i      int
}

func (s *framesStream) next(data bool) ([]byte, error) {
	if s.i >= len(s.frames) {
		return nil, io.EOF
	}
	if s.data[s.i] != data {
		return nil, errFrame
	}
	b := s.frames[s.i]
	s.i++
	return b, nil
}

func (s *framesStream) recv() ([]byte, error) { return s.next(false) }

func (s *framesStream) recvData(out *os.File, left int64) (int64, error) {
	b, err := s.next(true)
	if err != nil {
		return 0, err
	}
	if int64(len(b)) > left {
		return 0, errFrame
	}
	_, err = out.Write(b)
	return int64(len(b)), err
}

func (s *framesStream) ack(uint64) error { return nil }
func (s *framesStream) close()           {}

// appendUnit is a unit of one G frame: rel grows from from bytes with
// tail.
func appendUnit(unit uint64, rel string, from int64, tail []byte) *framesStream {
	return &framesStream{
		frames: [][]byte{
			jsonFrame(kindBegin, begin{Unit: unit, Epoch: 5}).GetValue(),
			appendFrame(rel, from+int64(len(tail)), from).GetValue(),
			tail,
			uvarintFrame(kindEnd, unit).GetValue(),
		},
		data: map[int]bool{2: true},
	}
}

// A standby applies a G frame as the first from bytes of its copy and
// the new ones (a copy longer than from, as one read past its stamp
// leaves it, is cut there), and refuses one its copy is too short for:
// the unit fails and changes nothing (the stream then starts again with
// a full sync).
func TestFollowerAppliesAppends(t *testing.T) {
	dir := t.TempDir()
	f, err := NewFollower(FollowerConfig{DataDir: dir, Member: "s1", Logger: testkit.Logger(),
		Dial: func(context.Context, string) (*grpc.ClientConn, error) { return nil, errors.New("no dialing here") }})
	if err != nil {
		t.Fatal(err)
	}
	rel := filepath.Join("reducer", "m", "journal.log")
	path := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	began := func() bool { return true }
	if _, err := f.applyUnit(appendUnit(1, rel, 10, []byte("abc")), 5, 0, began); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "0123456789abc" {
		t.Fatalf("after an append from 10: %q", got)
	}
	if _, err := f.applyUnit(appendUnit(2, rel, 8, []byte("XYZW")), 5, 0, began); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "01234567XYZW" {
		t.Fatalf("after an append from 8 to a copy of 13 bytes: %q", got)
	}
	_, err = f.applyUnit(appendUnit(3, rel, 20, []byte("!")), 5, 0, began)
	if err == nil || !strings.Contains(err.Error(), "holds 12") {
		t.Fatalf("an append from 20 to a copy of 12 bytes: %v", err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, []byte("01234567XYZW")) {
		t.Fatalf("a refused append changed the copy: %q", got)
	}
	_, err = f.applyUnit(appendUnit(3, filepath.Join("reducer", "m", "none.log"), 1, []byte("!")), 5, 0, began)
	if err == nil {
		t.Fatal("an append to a file this copy lacks was applied")
	}
	if _, err := os.Stat(filepath.Join(dir, "reducer", "m", "none.log")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused append made its file: %v", err)
	}
}

// A G frame that names no append — an offset of 0 or at or past the
// size, a size past the bound, a path out of the tree, bytes left over
// or cut short — is a malformed frame, and the follower applies nothing.
func TestParseAppendRefusesMalformedFrames(t *testing.T) {
	good := appendFrame("reducer/m/journal.log", 10, 4).GetValue()[1:]
	if rel, size, from, err := parseAppend(good); err != nil || rel != "reducer/m/journal.log" || size != 10 || from != 4 {
		t.Fatalf("a good frame: %q %d %d %v", rel, size, from, err)
	}
	for name, b := range map[string][]byte{
		"from 0":               appendFrame("reducer/m/journal.log", 10, 0).GetValue()[1:],
		"from at size":         appendFrame("reducer/m/journal.log", 10, 10).GetValue()[1:],
		"from past size":       appendFrame("reducer/m/journal.log", 10, 11).GetValue()[1:],
		"size past 1 TiB":      appendFrame("reducer/m/journal.log", 1<<40+1, 4).GetValue()[1:],
		"path out of the tree": appendFrame("../etc/passwd", 10, 4).GetValue()[1:],
		"bytes left over":      append(bytes.Clone(good), 0),
		"cut short":            good[:len(good)-1],
		"empty":                nil,
	} {
		if _, _, _, err := parseAppend(b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}
