package storerpc

// PushBudgetFull reports whether the pushes in progress hold every byte
// of s's budget (Config.MaxPushBytesInFlight) now.
func PushBudgetFull(s *Service) bool { return s.inFlight.Full() }
