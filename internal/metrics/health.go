package metrics

import (
	"fmt"
	"net/http"
)

// The probe paths: answered without a token (an orchestrator's probe
// cannot hold one safely: a Kubernetes pod spec is readable by whoever may
// read the pod), and saying nothing but this process's role.
const (
	// LivePath answers 200 while the process serves its endpoint.
	LivePath = "/healthz"
	// ReadyPath answers 200 when the process serves its role (Ready), 503
	// with the reason when not.
	ReadyPath = "/readyz"
)

// Ready reports whether a process with these sources serves its role, and
// a one-line reason: a process outside a cluster (a single hub, a relay, a
// worker) is ready while it serves; a cluster member is ready as the
// primary, or as a standby that holds a full copy of the primary it
// follows — so that a rolling restart (a Kubernetes StatefulSet waits for
// each pod to be ready before it restarts the next) never takes down a
// member while the one before it is still copying the primary's state.
func Ready(src Sources) (bool, string) {
	if src.Cluster == nil {
		return true, "ready"
	}
	st := src.Cluster()
	switch {
	case st.Outside:
		return false, "not a cluster member (joining, or out after a local fault)"
	case st.Primary:
		return true, fmt.Sprintf("primary, epoch %d", st.Epoch)
	case st.Synced:
		return true, fmt.Sprintf("standby, synced with the primary of epoch %d", st.Epoch)
	default:
		return false, fmt.Sprintf("standby, not yet synced with a primary (epoch %d)", st.Epoch)
	}
}

// probes serves LivePath and ReadyPath itself and hands every other
// request to next (the token guard and the mux behind it).
func probes(src Sources, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead || r.URL.Path != LivePath && r.URL.Path != ReadyPath {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if r.URL.Path == LivePath {
			fmt.Fprintln(w, "ok")
			return
		}
		ok, why := Ready(src)
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, why)
	})
}
