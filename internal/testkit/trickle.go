package testkit

import (
	"net"
	"time"
)

// Trickle writes body to conn one byte every gap, in the background,
// until it is all sent or a write fails (the peer hung up): a client
// slower than any real link. The channel is closed when it stopped.
func Trickle(conn net.Conn, body []byte, gap time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range body {
			if _, err := conn.Write(body[i : i+1]); err != nil {
				return
			}
			time.Sleep(gap)
		}
	}()
	return done
}
