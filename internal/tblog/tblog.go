// Package tblog writes TensorBoard scalar event files directly, so that
// `tensorboard --logdir DIR` plots a run's curves without TensorFlow or a
// Python process.
//
// The format (TensorFlow's TFRecord of tensorflow.Event protos):
//
//	record  = uint64 length (little-endian)
//	          uint32 masked CRC-32C of the 8 length bytes
//	          length bytes of data: one serialized Event
//	          uint32 masked CRC-32C of the data
//	masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8
//	Event   = { 1: double wall_time, 2: int64 step,
//	            3: string file_version ("brain.Event:2", first record only),
//	            5: Summary summary }
//	Summary = { 1: repeated Value value }
//	Value   = { 1: string tag, 2: float simple_value }
//
// The three messages are encoded by hand with protowire (a few fields of
// two stable protos; vendoring TensorFlow's .proto files would bring in
// far more than they need). A file is named
// events.out.tfevents.<unix seconds>.<host>.<pid>.<n>, which TensorBoard
// requires ("tfevents" in the name) and which keeps writers apart.
//
// Use: Create(dir, Config{}) → Scalar(tag, step, value)… → Close. Read
// decodes a file back, checking every CRC (tests and tools).
package tblog

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/rlhub/rlhub/internal/errs"
)

// FileVersion is the first event's file_version.
const FileVersion = "brain.Event:2"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func masked(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return ((c >> 15) | (c << 17)) + 0xa282ead8
}

// Config configures a Writer.
type Config struct {
	// Now is the wall clock for events' wall_time and the file name; nil
	// means time.Now.
	Now func() time.Time
	// FlushEvery: a Scalar call flushes to the file when this long has
	// passed since the last flush, so a live TensorBoard sees progress;
	// 0 means 2s, negative means only on Flush and Close.
	FlushEvery time.Duration
}

func (c *Config) validate() {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.FlushEvery == 0 {
		c.FlushEvery = 2 * time.Second
	}
}

// Writer appends scalar events to one event file. Safe for concurrent use.
type Writer struct {
	cfg  Config
	path string

	mu        sync.Mutex // guards the fields below
	f         *os.File
	w         *bufio.Writer
	lastFlush time.Time
	err       error // first write error; later calls return it
	closed    bool
}

var fileSeq atomic.Uint64

// Create makes dir (and parents) and a new event file in it, and writes
// the file-version event.
func Create(dir string, cfg Config) (*Writer, error) {
	cfg.validate()
	if dir == "" {
		return nil, errors.New("tblog: empty directory")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("tblog: %w", err)
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "localhost"
	}
	now := cfg.Now()
	name := fmt.Sprintf("events.out.tfevents.%d.%s.%d.%d", now.Unix(), host, os.Getpid(), fileSeq.Add(1))
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("tblog: %w", err)
	}
	w := &Writer{cfg: cfg, path: path, f: f, w: bufio.NewWriter(f), lastFlush: now}
	ev := protowire.AppendTag(nil, 1, protowire.Fixed64Type)
	ev = protowire.AppendFixed64(ev, math.Float64bits(wallTime(now)))
	ev = protowire.AppendTag(ev, 3, protowire.BytesType)
	ev = protowire.AppendString(ev, FileVersion)
	if err := errors.Join(w.record(ev), w.w.Flush()); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("tblog: %w", err)
	}
	return w, nil
}

// Path is the event file's path.
func (w *Writer) Path() string { return w.path }

func wallTime(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// record writes one framed record. w.mu must be held (or w unshared).
func (w *Writer) record(data []byte) error {
	var head [12]byte
	binary.LittleEndian.PutUint64(head[:8], uint64(len(data)))
	binary.LittleEndian.PutUint32(head[8:], masked(head[:8]))
	var tail [4]byte
	binary.LittleEndian.PutUint32(tail[:], masked(data))
	_, err := w.w.Write(head[:])
	if err == nil {
		_, err = w.w.Write(data)
	}
	if err == nil {
		_, err = w.w.Write(tail[:])
	}
	return err
}

// Scalar appends one scalar value of tag at step (stored as float32, as
// TensorBoard's simple_value is). A tag must be non-empty and at most 256
// bytes.
func (w *Writer) Scalar(tag string, step int64, value float64) error {
	return w.Scalars(step, map[string]float64{tag: value})
}

// Scalars appends one event at step holding every tag's value (tags in
// sorted order).
func (w *Writer) Scalars(step int64, values map[string]float64) error {
	tags := make([]string, 0, len(values))
	for t := range values {
		// TensorBoard's reader parses events as proto3: a string field that
		// is not UTF-8 fails the whole file, every scalar in it.
		if t == "" || len(t) > 256 || !utf8.ValidString(t) {
			return fmt.Errorf("tblog: tag %s: want 1 to 256 bytes of UTF-8", errs.Quote(t))
		}
		tags = append(tags, t)
	}
	slices.Sort(tags)
	var sum []byte
	for _, t := range tags {
		var v []byte
		v = protowire.AppendTag(v, 1, protowire.BytesType)
		v = protowire.AppendString(v, t)
		v = protowire.AppendTag(v, 2, protowire.Fixed32Type)
		v = protowire.AppendFixed32(v, math.Float32bits(float32(values[t])))
		sum = protowire.AppendTag(sum, 1, protowire.BytesType)
		sum = protowire.AppendBytes(sum, v)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return errors.New("tblog: writer is closed")
	}
	if w.err != nil {
		return w.err
	}
	now := w.cfg.Now()
	ev := protowire.AppendTag(nil, 1, protowire.Fixed64Type)
	ev = protowire.AppendFixed64(ev, math.Float64bits(wallTime(now)))
	ev = protowire.AppendTag(ev, 2, protowire.VarintType)
	ev = protowire.AppendVarint(ev, uint64(step))
	ev = protowire.AppendTag(ev, 5, protowire.BytesType)
	ev = protowire.AppendBytes(ev, sum)
	if err := w.record(ev); err != nil {
		w.err = fmt.Errorf("tblog: %w", err)
		return w.err
	}
	if w.cfg.FlushEvery > 0 && now.Sub(w.lastFlush) >= w.cfg.FlushEvery {
		w.lastFlush = now
		if err := w.w.Flush(); err != nil {
			w.err = fmt.Errorf("tblog: %w", err)
		}
	}
	return w.err
}

// Flush writes buffered events to the file.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.err != nil {
		return w.err
	}
	if err := w.w.Flush(); err != nil {
		w.err = fmt.Errorf("tblog: %w", err)
	}
	w.lastFlush = w.cfg.Now()
	return w.err
}

// Close flushes, syncs and closes the file. Safe to call twice.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return w.err
	}
	w.closed = true
	err := w.err
	if err == nil {
		err = w.w.Flush()
	}
	err = errors.Join(err, w.f.Sync(), w.f.Close())
	if err != nil && w.err == nil {
		w.err = fmt.Errorf("tblog: %w", err)
	}
	return w.err
}

// Event is one decoded event: the scalars it holds (file-version events
// have none).
type Event struct {
	WallTime    float64
	Step        int64
	FileVersion string
	Scalars     map[string]float32
}

// maxRecord bounds one record's length when reading.
const maxRecord = 64 << 20

// Read decodes every event of an event file, checking each record's
// CRCs. A truncated last record (a writer still appending) ends the list
// without an error.
func Read(r io.Reader) ([]Event, error) {
	br := bufio.NewReader(r)
	var out []Event
	for {
		var head [12]byte
		if _, err := io.ReadFull(br, head[:]); err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return out, nil
			}
			return out, err
		}
		if masked(head[:8]) != binary.LittleEndian.Uint32(head[8:]) {
			return out, fmt.Errorf("tblog: record %d: length CRC mismatch", len(out))
		}
		n := binary.LittleEndian.Uint64(head[:8])
		if n > maxRecord {
			return out, fmt.Errorf("tblog: record %d: length %d over %d", len(out), n, maxRecord)
		}
		data := make([]byte, n+4)
		if _, err := io.ReadFull(br, data); err != nil {
			return out, nil // truncated tail
		}
		if masked(data[:n]) != binary.LittleEndian.Uint32(data[n:]) {
			return out, fmt.Errorf("tblog: record %d: data CRC mismatch", len(out))
		}
		ev, err := decodeEvent(data[:n])
		if err != nil {
			return out, fmt.Errorf("tblog: record %d: %w", len(out), err)
		}
		out = append(out, ev)
	}
}

// fields walks b's top-level fields, calling f with each number, type and
// raw value (varints and fixed values decoded into v, bytes into bs).
func fields(b []byte, f func(num protowire.Number, typ protowire.Type, v uint64, bs []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v uint64
		var bs []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var x uint32
			x, n = protowire.ConsumeFixed32(b)
			v = uint64(x)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			bs, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, typ, v, bs); err != nil {
			return err
		}
	}
	return nil
}

func decodeEvent(b []byte) (Event, error) {
	var ev Event
	err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, bs []byte) error {
		switch {
		case num == 1 && typ == protowire.Fixed64Type:
			ev.WallTime = math.Float64frombits(v)
		case num == 2 && typ == protowire.VarintType:
			ev.Step = int64(v)
		case num == 3 && typ == protowire.BytesType:
			ev.FileVersion = string(bs)
		case num == 5 && typ == protowire.BytesType:
			return fields(bs, func(num protowire.Number, typ protowire.Type, _ uint64, val []byte) error {
				if num != 1 || typ != protowire.BytesType {
					return nil
				}
				var tag string
				var x float32
				var has bool
				if err := fields(val, func(num protowire.Number, typ protowire.Type, v uint64, bs []byte) error {
					switch {
					case num == 1 && typ == protowire.BytesType:
						tag = string(bs)
					case num == 2 && typ == protowire.Fixed32Type:
						x, has = math.Float32frombits(uint32(v)), true
					}
					return nil
				}); err != nil {
					return err
				}
				if has {
					if ev.Scalars == nil {
						ev.Scalars = map[string]float32{}
					}
					ev.Scalars[tag] = x
				}
				return nil
			})
		}
		return nil
	})
	return ev, err
}
