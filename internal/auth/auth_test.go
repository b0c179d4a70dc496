package auth

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rlhub/rlhub/internal/errs"
	rlhubv1 "github.com/rlhub/rlhub/proto/rlhub/v1"
)

var update = flag.Bool("update", false, "rewrite the policy table in docs/security.md")

func TestTokenFileRoundTrip(t *testing.T) {
	tok, hash, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, "rlh_") || Hash(tok) != hash || strings.Contains(hash, tok) {
		t.Fatalf("token %q hash %q", tok, hash)
	}
	line := Line(hash, Principal{Name: "alice", Role: Trainer, Scopes: []string{"ppo/", ""}})
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("# comment\n\n"+line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := v.Authenticate(tok)
	if err != nil || p.Name != "alice" || p.Role != Trainer || len(p.Scopes) != 2 || p.Scopes[1] != "" {
		t.Fatalf("principal %+v, %v", p, err)
	}
	if _, err := v.Authenticate("rlh_other"); !errors.Is(err, errs.ErrUnauthenticated) {
		t.Fatalf("unknown token: %v", err)
	}
	if _, err := v.Authenticate(""); !errors.Is(err, errs.ErrUnauthenticated) {
		t.Fatalf("no token: %v", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(path); err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Fatalf("world-writable token file: %v", err)
	}
}

func TestParseFileRejectsMalformedLines(t *testing.T) {
	h := Hash("x")
	long := strings.Repeat("r", 10000)
	for _, line := range []string{
		"nohash role=admin scope=*",
		"sha256:abc role=admin scope=*",
		h + " role=root scope=*",
		h + " role=admin",
		h + " scope=*",
		h + " role=admin scope=* colour=blue",
		h + " role=admin scope=*\n" + h + " role=reader scope=*",
		h + " role=" + long + " scope=*",
		// An empty scope item would be the empty prefix, every model: a
		// trailing or doubled comma, or scope= alone, must not widen the
		// token to the whole hub.
		h + " role=reader scope=",
		h + " role=reader scope=ppo/,",
		h + " role=reader scope=ppo/,,ars/",
		h + " role=reader scope=," + long,
		// Two lines run together (the first without its newline): the
		// second's role must not become the first token's.
		h + " role=reader scope=* name=watcher" + h + " role=admin scope=* name=root",
		h + " role=reader role=admin scope=*",
		// A name is shown by token ls, model ls and the logs: printable,
		// bounded.
		h + " role=reader scope=* name=evil\x1b]0;pwned\x07",
		h + " role=reader scope=* name=" + strings.Repeat("n", MaxNameBytes+1),
	} {
		_, err := ParseFile(strings.NewReader(line))
		if err == nil {
			t.Errorf("%.60q: accepted", line)
		} else if len(err.Error()) > 300 {
			t.Errorf("error echoes unbounded input: %d bytes", len(err.Error()))
		}
	}
}

// Only "*" is every model; the listed prefixes are what a token covers.
func TestParseScopes(t *testing.T) {
	for in, want := range map[string][]string{
		"ppo/":          {"ppo/"},
		"ppo/, ars/":    {"ppo/", "ars/"},
		"*":             {""},
		"ppo/,*":        {"ppo/", ""},
		"team-a/model1": {"team-a/model1"},
	} {
		got, err := ParseScopes(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseScopes(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	p := Principal{Role: Reader}
	for _, in := range []string{"", ",", "ppo/,", ",ppo/", "ppo/,,ars/", " , "} {
		scopes, err := ParseScopes(in)
		if err == nil {
			p.Scopes = scopes
			t.Errorf("ParseScopes(%q) = %q, accepted (covers secret/model: %v)", in, scopes, p.Covers("secret/model"))
		}
	}
}

func TestCoversAndAllow(t *testing.T) {
	p := Principal{Name: "t", Role: Trainer, Scopes: []string{"ppo/", "ars/"}}
	for m, want := range map[string]bool{"ppo/policy": true, "ppo/": true, "ars/r1": true, "ars/": true, "pp": false, "": false, "other": false} {
		if got := p.Covers(m); got != want {
			t.Errorf("Covers(%q) = %v, want %v", m, got, want)
		}
	}
	push, _ := Lookup(GRPC, "/rlhub.v1.ModelStore/Push")
	reg, _ := Lookup(GRPC, "/rlhub.v1.Reducer/Register")
	if err := Allow(p, push, []string{"ppo/x"}); err != nil {
		t.Errorf("trainer push in scope: %v", err)
	}
	if err := Allow(p, push, []string{"x"}); !errors.Is(err, errs.ErrPermission) {
		t.Errorf("out of scope: %v", err)
	}
	if err := Allow(p, reg, []string{"ppo/x"}); !errors.Is(err, errs.ErrPermission) || !strings.Contains(err.Error(), "needs role admin") {
		t.Errorf("trainer register: %v", err)
	}
	if err := Allow(p, push, []string{strings.Repeat("m", 100000)}); err == nil || len(err.Error()) > 400 {
		t.Errorf("a long model name is echoed whole or allowed: %d bytes", len(err.Error()))
	}
}

func TestSourcesReadTheirMessages(t *testing.T) {
	report, _ := Lookup(GRPC, "/rlhub.v1.WeightSync/Report")
	got := report.Model.Models(&rlhubv1.SyncReportRequest{Reports: []*rlhubv1.CollectorReport{{Model: "a"}, {Model: "b"}}})
	if strings.Join(got, ",") != "a,b" {
		t.Errorf("repeated field: %q", got)
	}
	if got := report.Model.Models(&rlhubv1.SyncReportRequest{}); len(got) != 1 || got[0] != "" {
		t.Errorf("no reports reads as every model: %q", got)
	}
	push, _ := Lookup(GRPC, "/rlhub.v1.ModelStore/Push")
	if got := push.Model.Models(&rlhubv1.StorePushRequest{Body: &rlhubv1.StorePushRequest_Chunk{}}); got[0] != "" {
		t.Errorf("a chunk first reads as every model: %q", got)
	}
	stop, _ := Lookup(GRPC, "/rlhub.v1.ARS/StopRun")
	if got := stop.Model.Models(&rlhubv1.ARSStopRunRequest{RunId: "r7"}); got[0] != "ars/r7" {
		t.Errorf("run id: %q", got)
	}
	// Every path in the table exists in its message (walk panics if not).
	for _, r := range Policy {
		if r.Plane == DataPlane && r.Header == "" {
			t.Errorf("%s: data-plane rule without a header type", r.Method)
		}
	}
}

// The policy table in docs/security.md is auth.Policy rendered: the table
// is the documentation. go test ./internal/auth -run TestPolicyDoc -update
// rewrites it.
func TestPolicyDoc(t *testing.T) {
	const begin, end = "<!-- policy table: generated by internal/auth (go test ./internal/auth -run TestPolicyDoc -update) -->\n", "<!-- end of policy table -->"
	path := filepath.Join("..", "..", "docs", "security.md")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no policy table markers", path)
	}
	want := doc[:i+len(begin)] + Markdown() + doc[j:]
	if want == doc {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("docs/security.md's policy table is not auth.Policy: run go test ./internal/auth -run TestPolicyDoc -update")
}
