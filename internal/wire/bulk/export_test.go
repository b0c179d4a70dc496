package bulk

import "syscall"

// RequestFrame is frameOf for the external tests: a request frame as a
// client sends it.
var RequestFrame = frameOf

// HookDial makes c call f with each address it is about to connect to,
// before the connect: an error from f fails the dial with no packet sent.
func HookDial(c *Client, f func(address string) error) {
	orig := c.dialer.Control
	c.dialer.Control = func(network, address string, rc syscall.RawConn) error {
		if err := f(address); err != nil {
			return err
		}
		if orig != nil {
			return orig(network, address, rc)
		}
		return nil
	}
}
