package auth

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// What a token file reload costs, by file size (read, parse, hash check,
// swap, and the walk over live calls).
func BenchmarkReloadFile(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			var sb strings.Builder
			for i := range n {
				_, hash, _ := NewToken()
				sb.WriteString(Line(hash, Principal{Name: fmt.Sprintf("t%d", i), Role: Trainer, Scopes: []string{"ppo/"}}) + "\n")
			}
			path := filepath.Join(b.TempDir(), "tokens")
			if err := os.WriteFile(path, []byte(sb.String()), 0o600); err != nil {
				b.Fatal(err)
			}
			v, err := LoadFile(path)
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				if _, _, err := v.ReloadFile(path); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// What tracking a call for revocation adds to each admitted RPC, with
// other calls live, against authenticating alone (the baseline).
func BenchmarkTrackedCall(b *testing.B) {
	tok, hash, _ := NewToken()
	p := Principal{Name: "t", Role: Trainer, Scopes: []string{""}}
	for _, live := range []int{0, 1000} {
		v := NewVerifier(map[string]Principal{hash: p})
		for range live {
			_, done, _ := v.track(context.Background(), hash, p)
			defer done()
		}
		b.Run(fmt.Sprintf("live=%d/authenticate", live), func(b *testing.B) {
			for b.Loop() {
				if _, _, err := v.authenticate(tok); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("live=%d/authenticate+track", live), func(b *testing.B) {
			for b.Loop() {
				p, h, err := v.authenticate(tok)
				if err != nil {
					b.Fatal(err)
				}
				_, done, err := v.track(context.Background(), h, p)
				if err != nil {
					b.Fatal(err)
				}
				done()
			}
		})
	}
}

// The quota book's own cost per push (without the store listing).
func BenchmarkReserveQuota(b *testing.B) {
	v := NewVerifier(map[string]Principal{})
	p := Principal{Name: "q", Role: Trainer, Quota: Quota{Models: 1 << 20, Bytes: 1 << 50}}
	for b.Loop() {
		release, err := v.ReserveQuota(p, "m", 4096, Usage{Models: 10, Bytes: 40960, Owns: true, ModelBytes: 4096})
		if err != nil {
			b.Fatal(err)
		}
		release()
	}
}

// A max-rps check per request (the bucket of one token), against a token
// without a rate (the baseline: one comparison).
func BenchmarkRateCheck(b *testing.B) {
	v := NewVerifier(map[string]Principal{})
	for _, r := range []float64{0, 1e12} {
		p := Principal{Name: "r", Quota: Quota{Rate: r}}
		b.Run(fmt.Sprintf("rate=%g", r), func(b *testing.B) {
			for b.Loop() {
				if err := v.allowRate(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
