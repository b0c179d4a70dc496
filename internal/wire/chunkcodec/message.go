package chunkcodec

import "google.golang.org/protobuf/proto"

// Message is the decoded message m holds (nil for a chunk): what
// internal/auth reads a stream's first message through, whichever codec
// the call used.
func (m *Msg[M]) Message() proto.Message { return m.Msg }

// Received is the message a server stream's RecvMsg decoded into m,
// whichever codec the call used: a Msg's decoded message (nil for a
// chunk), m itself when it is a message, else nil.
func Received(m any) proto.Message {
	switch m := m.(type) {
	case interface{ Message() proto.Message }:
		return m.Message()
	case proto.Message:
		return m
	}
	return nil
}
