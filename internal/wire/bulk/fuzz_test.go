package bulk

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// frameOf encodes a request frame as a client sends it.
func frameOf(method string, header []byte) []byte {
	b := []byte{kindRequest}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(method)))
	b = append(b, method...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(header)))
	return append(b, header...)
}

// FuzzReadRequest feeds arbitrary bytes, as a data-plane client would send
// them after the magic, to the server's request-frame reader: it must never
// panic or allocate past its limits, must fail on a malformed frame (a
// frameError the server answers) or a short one (io errors), and a frame it
// accepts re-encodes to exactly the bytes it consumed.
func FuzzReadRequest(f *testing.F) {
	f.Add(frameOf("rlhub.v1.Reducer/Push", []byte{8, 1, 18, 3}))
	f.Add(frameOf("m", nil))
	f.Add([]byte{kindRequest, 0, 0})
	f.Add([]byte{kindRequest, 3, 0, 's', 'u'})
	f.Add([]byte{kindFinal, 0, 0, 0, 0})
	f.Add(append(frameOf("x", nil)[:4], 0xff, 0xff, 0xff, 0x7f))
	a, b := net.Pipe() // SetReadDeadline needs a connection; reads come from br
	defer a.Close()
	defer b.Close()
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		sc := &serverConn{Conn: a, br: bufio.NewReader(r), frame: time.Second}
		req, err := readRequest(sc)
		if err != nil {
			var fe frameError
			if !errors.As(err, &fe) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("unexpected error kind %T: %v", err, err)
			}
			return
		}
		if len(req.Method) < 1 || len(req.Method) > MaxMethodBytes || len(req.Header) > MaxHeaderBytes {
			t.Fatalf("accepted method of %d bytes, header of %d", len(req.Method), len(req.Header))
		}
		consumed := len(data) - r.Len() - sc.br.Buffered()
		if enc := frameOf(req.Method, req.Header); !bytes.Equal(enc, data[:consumed]) {
			t.Fatalf("accepted frame re-encodes to %x, consumed %x", enc, data[:consumed])
		}
	})
}
