// Package wire moves safetensors blobs over gRPC streams in chunks, per the
// transfer shape in proto/rlhub/v1/tensor.proto.
//
// Sending copies no tensor bytes on rlhub's side: each chunk is a slice of
// the header or of one tensor's Data (chunks never span two tensors).
// Receiving copies each chunk once, into one 8-byte-aligned buffer of the
// announced size, checking size limits before allocating it and the header
// length as soon as the first 8 bytes arrive. The copies grpc-go itself
// makes on the way are listed, and measured, in docs/wire.md.
package wire

import (
	"errors"
	"fmt"
	"io"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/safetensors"
	"github.com/rlhub/rlhub/internal/tensor"
)

// DefaultChunkBytes is the default largest chunk, 1 MiB.
const DefaultChunkBytes = 1 << 20

// Chunks calls yield with consecutive pieces of l's encoding, each at most
// chunkBytes long (DefaultChunkBytes if ≤ 0) and never spanning two tensors.
// The slices alias l.Header and the tensors' Data; yield must not keep or
// modify them after it returns unless the tensors are immutable.
func Chunks(l *safetensors.Layout, chunkBytes int, yield func([]byte) error) error {
	if chunkBytes <= 0 {
		chunkBytes = DefaultChunkBytes
	}
	emit := func(b []byte) error {
		for len(b) > 0 {
			n := min(len(b), chunkBytes)
			if err := yield(b[:n:n]); err != nil {
				return err
			}
			b = b[n:]
		}
		return nil
	}
	if err := emit(l.Header); err != nil {
		return err
	}
	for _, t := range l.Order {
		if err := emit(t.Data); err != nil {
			return err
		}
	}
	return nil
}

// ChunksOf is Chunks over an already encoded blob.
func ChunksOf(blob []byte, chunkBytes int, yield func([]byte) error) error {
	if chunkBytes <= 0 {
		chunkBytes = DefaultChunkBytes
	}
	for len(blob) > 0 {
		n := min(len(blob), chunkBytes)
		if err := yield(blob[:n:n]); err != nil {
			return err
		}
		blob = blob[n:]
	}
	return nil
}

// Limits bound what an Assembler accepts. Zero fields mean no limit beyond
// the defaults noted.
type Limits struct {
	// MaxBytes bounds the announced blob size; 0 means 4 GiB.
	MaxBytes int64
	// MaxHeaderBytes bounds the JSON header; 0 means 16 MiB (far above any
	// real model, far below the format's 100 MB).
	MaxHeaderBytes int64
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = 4 << 30
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = 16 << 20
	}
	return l
}

// Assembler collects the chunks of one blob. It is not safe for concurrent
// use. After any error it stays failed: every later Write and Finish return
// the first error.
type Assembler struct {
	lim  Limits
	buf  []byte
	n    int
	hdrs bool  // header length checked
	err  error // first error, sticky
}

// NewAssembler prepares to receive a blob of exactly total bytes. It fails
// with errs.ErrFull when total exceeds the limit and errs.ErrInvalid when it
// cannot even hold a header, before allocating anything.
func NewAssembler(total uint64, lim Limits) (*Assembler, error) {
	a, err := newAssembler(total, lim)
	if err != nil {
		return nil, err
	}
	a.buf = tensor.AlignedBytes(int(total))
	return a, nil
}

// newAssembler checks total against the limits; the caller sets buf.
func newAssembler(total uint64, lim Limits) (*Assembler, error) {
	lim = lim.withDefaults()
	if total > uint64(lim.MaxBytes) {
		return nil, fmt.Errorf("%w: blob of %d bytes exceeds the limit of %d", errs.ErrFull, total, lim.MaxBytes)
	}
	if total < 10 {
		return nil, fmt.Errorf("%w: blob of %d bytes is too small to be safetensors", errs.ErrInvalid, total)
	}
	return &Assembler{lim: lim}, nil
}

// NewAssemblerInto is NewAssembler receiving into buf[:total] instead of
// fresh memory when cap(buf) ≥ total and buf starts 8-byte aligned, as the
// decoder's zero-copy tensor views need (else it allocates, as NewAssembler
// does, and leaves buf alone). The caller must not use buf until Finish
// hands it back, and buf's old contents are overwritten; the limits are
// checked first either way.
func NewAssemblerInto(buf []byte, total uint64, lim Limits) (*Assembler, error) {
	a, err := newAssembler(total, lim)
	if err != nil {
		return nil, err
	}
	if uint64(cap(buf)) >= total && tensor.Aligned(buf) {
		a.buf = buf[:total]
	} else {
		a.buf = tensor.AlignedBytes(int(total))
	}
	return a, nil
}

// Write appends a chunk. It fails when the chunks overrun the announced size
// or the header length is out of bounds.
func (a *Assembler) Write(p []byte) error {
	if a.err != nil {
		return a.err
	}
	if len(p) > len(a.buf)-a.n {
		a.err = fmt.Errorf("%w: chunks overrun the announced %d bytes (%d received, chunk of %d)", errs.ErrInvalid, len(a.buf), a.n, len(p))
		return a.err
	}
	a.n += copy(a.buf[a.n:], p)
	return a.checkHeader()
}

// ReadFrom reads the rest of the blob from r straight into its buffer, no
// chunk copied in between (a data-plane body), checking the header length
// as Write does once 8 bytes are in: the first read stops there, so that
// a length out of bounds is refused before the rest is read. It stops at
// the announced size; r ending before it is an error, as is any of r's.
func (a *Assembler) ReadFrom(r io.Reader) (int64, error) {
	start := a.n
	for a.err == nil && a.n < len(a.buf) {
		end := len(a.buf)
		if !a.hdrs {
			end = min(end, 8)
		}
		k, err := r.Read(a.buf[a.n:end])
		a.n += k
		if a.checkHeader() != nil {
			break
		}
		switch {
		case errors.Is(err, io.EOF) && a.n < len(a.buf):
			a.err = fmt.Errorf("%w: body ended after %d of %d announced bytes", errs.ErrInvalid, a.n, len(a.buf))
		case err != nil && !errors.Is(err, io.EOF):
			a.err = err
		}
	}
	return int64(a.n - start), a.err
}

// checkHeader checks the header length once 8 bytes are in.
func (a *Assembler) checkHeader() error {
	if a.hdrs || a.n < 8 {
		return nil
	}
	a.hdrs = true
	n, err := safetensors.HeaderLen(a.buf[:8], a.lim.MaxHeaderBytes)
	if err != nil {
		a.err = err
		return err
	}
	if n > uint64(len(a.buf)-8) {
		a.err = fmt.Errorf("%w: header length %d exceeds the announced blob of %d bytes", errs.ErrInvalid, n, len(a.buf))
		return a.err
	}
	return nil
}

// Received returns how many bytes have arrived.
func (a *Assembler) Received() int { return a.n }

// Finish checks that the whole blob arrived and decodes it. The returned
// File's tensors alias the returned blob, which the caller now owns.
func (a *Assembler) Finish() (*safetensors.File, []byte, error) {
	if a.err != nil {
		return nil, nil, a.err
	}
	if a.n != len(a.buf) {
		return nil, nil, fmt.Errorf("%w: stream ended after %d of %d announced bytes", errs.ErrInvalid, a.n, len(a.buf))
	}
	f, err := safetensors.DecodeOptions(a.buf, safetensors.Options{MaxHeaderBytes: a.lim.MaxHeaderBytes})
	if err != nil {
		return nil, nil, err
	}
	return f, a.buf, nil
}
