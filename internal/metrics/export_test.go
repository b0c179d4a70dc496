package metrics

// Waiting is how many requests wait for a reading of the Sources in
// progress: dashboard requests (/api/state, /) and /metrics scrapes.
func Waiting(s *Server) (dashboard, scrapes int) {
	return s.dash.states.waiters(), s.gather.s.waiters()
}

// Encodes is how many /metrics responses the server has encoded.
func Encodes(s *Server) int64 { return s.gather.encodes.Load() }
