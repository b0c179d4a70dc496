package auth

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/store"
)

// Role is what a token may do. Roles are ordered: each includes every
// lower one.
type Role int

// Roles, lowest first. Public is for methods anyone may call without a
// token (health checks); no token has it.
const (
	Public Role = iota
	Reader
	Worker
	Trainer
	Admin
)

var roleNames = []string{"public", "reader", "worker", "trainer", "admin"}

func (r Role) String() string {
	if r >= 0 && int(r) < len(roleNames) {
		return roleNames[r]
	}
	return fmt.Sprintf("role(%d)", int(r))
}

// ParseRole reads a role name (reader, worker, trainer, admin).
func ParseRole(s string) (Role, error) {
	for i, n := range roleNames[1:] {
		if s == n {
			return Role(i + 1), nil
		}
	}
	return 0, fmt.Errorf("auth: role %q: want reader, worker, trainer or admin", clip(s))
}

// Principal is an authenticated caller.
type Principal struct {
	// Name identifies the token in logs and errors (never the secret).
	Name string
	// Role is what it may do.
	Role Role
	// Scopes are the model-name prefixes it may touch; "" covers every
	// model.
	Scopes []string
	// Expires is when the token stops being accepted (the token file's
	// expires=, RFC 3339); the zero time means never.
	Expires time.Time
	// Quota bounds what the token's pushes may make the store hold; the
	// zero value means no bound.
	Quota Quota
}

// Quota bounds the models a token's identity owns in the store (models
// created by its pushes, store rule 6): how many, and the bytes of their
// newest versions together. Zero means no bound. Pushes past a bound fail
// with errs.ErrFull (ResourceExhausted) before their body is read.
//
// Rate bounds the token's requests per second, gRPC calls and data-plane
// requests together (a token bucket holding max(1, ⌈Rate⌉) requests):
// past it a request fails with errs.ErrFull before its handler runs.
type Quota struct {
	Models int     // token file max-models=
	Bytes  int64   // token file max-bytes= (bytes, or with a KiB/MiB/GiB suffix)
	Rate   float64 // token file max-rps=
}

// Owner is the store owner identity of a principal's pushes (store rule
// 6): "token:" and the token's name, so a token reissued under the same
// name keeps its models.
func (p Principal) Owner() string { return store.TokenOwnerPrefix + p.Name }

// equal reports whether p and q grant the same (a reload that leaves a
// token's line alone keeps its open streams).
func (p Principal) equal(q Principal) bool {
	return p.Name == q.Name && p.Role == q.Role && slices.Equal(p.Scopes, q.Scopes) && p.Expires.Equal(q.Expires) && p.Quota == q.Quota
}

// Covers reports whether p may touch model name m (a name, or a
// namespace prefix such as "ars/": then p must cover every name in it).
func (p Principal) Covers(m string) bool {
	for _, s := range p.Scopes {
		if strings.HasPrefix(m, s) {
			return true
		}
	}
	return false
}

// tokenPrefix starts every token rlhub issues (so a leaked one is easy to
// find in logs and repositories).
const tokenPrefix = "rlh_"

// NewToken returns a fresh random token (256 bits) and its hash.
func NewToken() (token, hash string, err error) {
	var b [32]byte
	if _, err := io.ReadFull(rand.Reader, b[:]); err != nil {
		return "", "", fmt.Errorf("auth: random token: %w", err)
	}
	token = tokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	return token, Hash(token), nil
}

// Hash is what the token file stores for token: "sha256:" and the hex
// digest. Tokens are 256 random bits, so a fast hash is enough.
func Hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Line is the token-file line for a token's hash.
func Line(hash string, p Principal) string {
	scopes := make([]string, len(p.Scopes))
	for i, s := range p.Scopes {
		if s == "" {
			s = "*"
		}
		scopes[i] = s
	}
	line := fmt.Sprintf("%s role=%s scope=%s name=%s", hash, p.Role, strings.Join(scopes, ","), p.Name)
	if !p.Expires.IsZero() {
		line += " expires=" + p.Expires.UTC().Format(time.RFC3339)
	}
	if p.Quota.Models > 0 {
		line += " max-models=" + strconv.Itoa(p.Quota.Models)
	}
	if p.Quota.Bytes > 0 {
		line += " max-bytes=" + strconv.FormatInt(p.Quota.Bytes, 10)
	}
	if p.Quota.Rate > 0 {
		line += " max-rps=" + strconv.FormatFloat(p.Quota.Rate, 'g', -1, 64)
	}
	return line
}

// ParseBytes reads a byte count: digits, optionally followed by KiB, MiB,
// GiB or TiB.
func ParseBytes(s string) (int64, error) {
	mult := int64(1)
	for i, suf := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if t, ok := strings.CutSuffix(s, suf); ok {
			s, mult = t, int64(1)<<(10*(i+1))
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("auth: %q is not a byte count (digits, optionally KiB/MiB/GiB/TiB)", clip(s))
	}
	return n * mult, nil
}

// ParseScopes reads a comma-separated scope list of model-name prefixes;
// only "*" is every model. An empty item (scope=, a trailing or doubled
// comma) is refused: it would otherwise be the empty prefix, every model,
// so a typo would widen a token to the whole hub.
func ParseScopes(s string) ([]string, error) {
	var out []string
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		switch part {
		case "":
			return nil, fmt.Errorf("auth: scope list %q has an empty item: give model-name prefixes, or * for every model", clip(s))
		case "*":
			part = ""
		}
		if strings.ContainsAny(part, " \t=") {
			return nil, fmt.Errorf("auth: scope %q has white space or '='", clip(part))
		}
		out = append(out, part)
	}
	return out, nil
}

// MaxNameBytes bounds a token's name: it is shown by token ls, model ls
// (a model's owner) and the hub's logs.
const MaxNameBytes = 128

// CheckPrincipalName refuses a token name longer than MaxNameBytes or
// holding an unprintable character (a terminal escape would reach every
// table and log line that shows it).
func CheckPrincipalName(name string) error {
	return errs.CheckName("token name", name, MaxNameBytes)
}

// ParseFile reads a token file: one token a line,
//
//	sha256:HEX role=ROLE scope=PREFIX[,PREFIX...] name=NAME [expires=RFC3339] [max-models=N] [max-bytes=SIZE]
//
// blank lines and lines starting with # ignored. It returns the
// principals by hash.
func ParseFile(r io.Reader) (map[string]Principal, error) {
	out := map[string]Principal{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		hash := fields[0]
		if !strings.HasPrefix(hash, "sha256:") || len(hash) != len("sha256:")+64 {
			return nil, fmt.Errorf("auth: token file line %d: want sha256:<64 hex digits> first", n)
		}
		if _, err := hex.DecodeString(hash[len("sha256:"):]); err != nil {
			return nil, fmt.Errorf("auth: token file line %d: the hash is not hex", n)
		}
		p := Principal{Name: fmt.Sprintf("line%d", n)}
		var haveRole, haveScope bool
		seen := map[string]bool{}
		for _, f := range fields[1:] {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				return nil, fmt.Errorf("auth: token file line %d: %q is not key=value", n, clip(f))
			}
			if seen[k] {
				// Two lines run together (one without its newline) would
				// otherwise give the first token the second one's role.
				return nil, fmt.Errorf("auth: token file line %d: %q given twice (two lines run together?)", n, clip(k))
			}
			seen[k] = true
			var err error
			switch k {
			case "role":
				p.Role, err = ParseRole(v)
				haveRole = true
			case "scope":
				p.Scopes, err = ParseScopes(v)
				haveScope = true
			case "name":
				p.Name = v
				err = CheckPrincipalName(v)
			case "expires":
				p.Expires, err = time.Parse(time.RFC3339, v)
				if err != nil {
					err = fmt.Errorf("expires=%q: want an RFC 3339 time (2026-12-31T23:00:00Z)", clip(v))
				}
			case "max-models":
				p.Quota.Models, err = strconv.Atoi(v)
				if err != nil || p.Quota.Models < 0 {
					err = fmt.Errorf("max-models=%q: want a count", clip(v))
				}
			case "max-bytes":
				p.Quota.Bytes, err = ParseBytes(v)
			case "max-rps":
				p.Quota.Rate, err = strconv.ParseFloat(v, 64)
				if err != nil || !(p.Quota.Rate >= 0) || math.IsInf(p.Quota.Rate, 0) {
					err = fmt.Errorf("max-rps=%q: want requests per second (0.5, 100)", clip(v))
				}
			default:
				err = fmt.Errorf("unknown key %q", clip(k))
			}
			if err != nil {
				return nil, fmt.Errorf("auth: token file line %d: %w", n, err)
			}
		}
		if !haveRole || !haveScope {
			return nil, fmt.Errorf("auth: token file line %d: role= and scope= are required", n)
		}
		if _, dup := out[hash]; dup {
			return nil, fmt.Errorf("auth: token file line %d: the same token twice", n)
		}
		out[hash] = p
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auth: token file: %w", err)
	}
	return out, nil
}

// LoadFile reads a token file into a Verifier. A file other users may
// write is refused: it decides who may do what.
func LoadFile(path string) (*Verifier, error) {
	s := stamp(path)
	tokens, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	v := NewVerifier(tokens)
	v.setLoaded(s)
	return v, nil
}

// ReadFile reads and checks a token file (the checks of LoadFile) and
// returns its principals by hash.
func ReadFile(path string) (map[string]Principal, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("auth: token file %s is writable by others (mode %v): chmod 600 it", path, st.Mode().Perm())
	}
	tokens, err := ParseFile(f)
	if err != nil {
		return nil, err
	}
	if len(tokens) == 0 {
		return nil, errors.New("auth: token file " + path + " holds no token")
	}
	return tokens, nil
}

// clip bounds client-supplied text quoted in an error.
func clip(s string) string {
	const max = 64
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}
