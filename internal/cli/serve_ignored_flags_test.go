package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCapsBelowMinusOneAndIgnoredAuthReloadAreRefused: hub.Limits,
// reducer.Config and relay.Config read any negative cap as -1, "no cap"
// (or no secondaries), so serve --max-conns-per-peer -5 served with no
// connection cap and --max-streams-per-peer -7 with no stream cap,
// unsaid; the relay's --max-streams-per-peer 0 capped streams at the
// default and calls not at all. --auth-reload without --auth-tokens was
// taken and ignored, and --auth-reload -5s read as -1s. Each is now
// refused, naming the flag, before anything starts: no address written,
// no data directory made, no relay listening.
func TestCapsBelowMinusOneAndIgnoredAuthReloadAreRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-conns-per-peer", "-5"}, "--max-conns-per-peer -5: give -1"},
		{[]string{"--max-streams-per-peer", "-7"}, "--max-streams-per-peer -7: give -1"},
		{[]string{"--reducer-secondaries", "-2"}, "--reducer-secondaries -2: give -1"},
		{[]string{"--auth-reload", "5s"}, "--auth-reload needs --auth-tokens"},
		{[]string{"--auth-reload", "-1s"}, "--auth-reload needs --auth-tokens"},
		{[]string{"--auth-tokens", tokenFileFor(t), "--auth-reload", "-5s"}, "--auth-reload -5s: give -1s"},
	} {
		dir := t.TempDir()
		addrFile, data := filepath.Join(dir, "addr"), filepath.Join(dir, "data")
		code, errOut := runUntilAddr(t, addrFile, append([]string{"serve", "--listen", "127.0.0.1:0", "--addr-file", addrFile, "--data", data}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, "rlhub: "+c.want) {
			t.Errorf("serve %v: exit %d, stderr %q; want it refused with %q", c.args, code, strings.TrimSpace(errOut), c.want)
		}
		for _, p := range []string{addrFile, data} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("serve %v made %s (%v): it started", c.args, p, err)
			}
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-streams-per-peer", "-7"}, "--max-streams-per-peer -7: give -1"},
		{[]string{"--max-streams-per-peer", "0"}, "--max-streams-per-peer 0: give -1"},
		{[]string{"--auth-reload", "5s"}, "--auth-reload needs --auth-tokens"},
		{[]string{"--auth-tokens", tokenFileFor(t), "--auth-reload", "-5s"}, "--auth-reload -5s: give -1s"},
	} {
		// An upstream where no hub listens and a free listen address: a
		// refused flag never binds it (a relay that started would).
		listen := freeAddr(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		code, out, errOut := run(t, ctx, append([]string{"relay", "--upstream", "127.0.0.1:1", "--model", "m", "--no-shm", "--listen", listen}, c.args...)...)
		cancel()
		if code == 0 || !strings.Contains(errOut, "rlhub: "+c.want) || strings.Contains(out, "listening") {
			if len(errOut) > 300 { // a relay that started logs every retry of its upstream
				errOut = errOut[:300] + "..."
			}
			t.Errorf("relay %v: exit %d, stdout %q, stderr %q; want it refused with %q", c.args, code, out, strings.TrimSpace(errOut), c.want)
		}
	}
}

// runUntilAddr runs the command until it exits or writes addrFile (then
// stops it as SIGINT would), and returns its exit code and stderr.
func runUntilAddr(t *testing.T, addrFile string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	var code int
	var errOut string
	go func() {
		defer close(done)
		code, _, errOut = run(t, ctx, args...)
	}()
	for {
		select {
		case <-done:
			return code, errOut
		case <-time.After(20 * time.Millisecond):
		}
		if _, err := os.Stat(addrFile); err == nil {
			cancel()
			<-done
			return code, errOut
		}
	}
}

// tokenFileFor writes a token file with one reader token and returns its
// path.
func tokenFileFor(t *testing.T) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "tokens")
	if code, _, errOut := run(t, context.Background(), "token", "new", "--role", "reader", "--scope", "*", "--append", file); code != 0 {
		t.Fatalf("token new: %s", errOut)
	}
	return file
}
