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
	"os"
	"strings"
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
	return fmt.Sprintf("%s role=%s scope=%s name=%s", hash, p.Role, strings.Join(scopes, ","), p.Name)
}

// ParseScopes reads a comma-separated scope list; "*" (or "") is every
// model.
func ParseScopes(s string) ([]string, error) {
	var out []string
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "*" {
			part = ""
		}
		if strings.ContainsAny(part, " \t=") {
			return nil, fmt.Errorf("auth: scope %q has white space or '='", clip(part))
		}
		out = append(out, part)
	}
	return out, nil
}

// ParseFile reads a token file: one token a line,
//
//	sha256:HEX role=ROLE scope=PREFIX[,PREFIX...] name=NAME
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
		for _, f := range fields[1:] {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				return nil, fmt.Errorf("auth: token file line %d: %q is not key=value", n, clip(f))
			}
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
// read or write is refused: it decides who may do what.
func LoadFile(path string) (*Verifier, error) {
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
	return NewVerifier(tokens), nil
}

// clip bounds client-supplied text quoted in an error.
func clip(s string) string {
	const max = 64
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}
