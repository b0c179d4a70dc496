package storerpc

import "github.com/rlhub/rlhub/internal/wire/bulk"

// PushBudgetFull reports whether the pushes in progress hold every byte
// of s's budget (Config.MaxPushBytesInFlight) now.
func PushBudgetFull(s *Service) bool { return s.inFlight.Full() }

// SetBulk makes c use b for the data plane (closing the client it had):
// tests shorten its timeouts this way.
func SetBulk(c *Client, b *bulk.Client) {
	c.bulk.Close()
	c.bulk = b
}
