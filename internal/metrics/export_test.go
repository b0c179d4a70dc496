package metrics

// Waiting is how many requests wait for a reading of the Sources in
// progress: dashboard requests (/api/state, /) and /metrics scrapes.
func Waiting(s *Server) (dashboard, scrapes int) {
	return s.dash.states.waiters(), s.gather.s.waiters()
}
