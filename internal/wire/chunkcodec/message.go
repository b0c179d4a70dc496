package chunkcodec

import "google.golang.org/protobuf/proto"

// Message is the decoded message m holds (nil for a chunk): what
// internal/auth reads a stream's first message through, whichever codec
// the call used.
func (m *Msg[M]) Message() proto.Message { return m.Msg }
