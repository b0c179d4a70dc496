package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/atomicfile"
	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/errs"
	"github.com/rlhub/rlhub/internal/hub"
	"github.com/rlhub/rlhub/internal/netsec"
)

// serveSecurity are serve's server-side security flags; the certificate
// and key are the shared --tls-cert/--tls-key.
type serveSecurity struct {
	tokens   string
	reload   time.Duration
	clientCA string
	insecure bool
}

func (s *serveSecurity) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&s.tokens, "auth-tokens", "", "token `FILE` of hashes, roles and scopes (lines printed by rlhub token new): every call then needs a token")
	f.DurationVar(&s.reload, "auth-reload", auth.DefaultReloadInterval, "how often the hub looks at --auth-tokens for changes and reloads it (SIGHUP reloads at once; -1s: only on SIGHUP; 0: the default)")
	f.StringVar(&s.clientCA, "tls-client-ca", "", "with --tls-cert: require client certificates signed by this CA (mutual TLS)")
	f.BoolVar(&s.insecure, "insecure", false, "allow a non-loopback --listen (and --metrics-listen) without TLS and tokens: plaintext, and anyone who reaches the port may do anything (warned on stderr and in the log)")
}

// refuseIgnored refuses, before anything starts, the security flags that
// would be taken and ignored: --auth-reload without --auth-tokens (no
// file to reload) and a negative --auth-reload other than -1s (read as
// it). (--tls-client-ca without a certificate, and --tls-cert without
// --tls-key, are refused by resolve.)
func (s *serveSecurity) refuseIgnored(cmd *cobra.Command) error {
	if s.tokens == "" && cmd.Flags().Changed("auth-reload") {
		return fmt.Errorf("--auth-reload needs --auth-tokens FILE: it is how often that file is reloaded")
	}
	if s.reload < 0 && s.reload != -time.Second {
		return fmt.Errorf("--auth-reload %v: give -1s for SIGHUP only, or a positive interval", s.reload)
	}
	return nil
}

// apply fills cfg's TLS and Auth from the flags and refuses an exposed
// listener without both (docs/security.md, secure by default).
func (s *serveSecurity) apply(g *globals, cfg *hub.Config) error {
	tc, v, err := s.resolve(g, "serve", cfg.Listen)
	if err != nil {
		return err
	}
	cfg.TLS, cfg.Auth, cfg.MetricsInsecure = tc, v, s.insecure
	if v != nil {
		cfg.AuthFile, cfg.AuthReloadInterval, cfg.AuthReloadOnSIGHUP = s.tokens, s.reload, true
	}
	return nil
}

// resolve loads the server side of a listener (serve's, the relay's): TLS
// from the shared --tls-cert/--tls-key (and --tls-client-ca), tokens from
// --auth-tokens; a listen address off loopback without both is refused
// (exit code 2) unless --insecure, which lets it through loudly.
func (s *serveSecurity) resolve(g *globals, cmd, listen string) (*tls.Config, *auth.Verifier, error) {
	files := g.conn.files // already resolved against the environment
	var tc *tls.Config
	var v *auth.Verifier
	if files.Cert != "" || files.Key != "" {
		var err error
		if tc, err = dial.ServerTLS(files.Cert, files.Key, s.clientCA); err != nil {
			return nil, nil, err
		}
	} else if s.clientCA != "" {
		return nil, nil, fmt.Errorf("--tls-client-ca needs --tls-cert and --tls-key")
	}
	if s.tokens != "" {
		var err error
		if v, err = auth.LoadFile(s.tokens); err != nil {
			return nil, nil, err
		}
	}
	if netsec.IsLoopback(listen) || (tc != nil && v != nil) {
		return tc, v, nil
	}
	var missing []string
	if tc == nil {
		missing = append(missing, "--tls-cert FILE --tls-key FILE")
	}
	if v == nil {
		missing = append(missing, "--auth-tokens FILE")
	}
	if !s.insecure {
		return nil, nil, &exitError{code: 2, err: fmt.Errorf("%s: --listen %s is not a loopback address and it would be open to anyone who reaches it: pass %s (make them with `rlhub cert` and `rlhub token new`; docs/security.md), or --insecure to serve it anyway",
			cmd, listen, strings.Join(missing, " and "))}
	}
	g.logger.Warn("INSECURE: serving a non-loopback address without "+strings.Join(missing, " and ")+
		": traffic is readable and anyone who reaches the port may read, overwrite or delete any model", "listen", listen)
	fmt.Fprintf(g.stderr, "rlhub: WARNING: --insecure: %s is served without %s\n", listen, strings.Join(missing, " and "))
	return tc, v, nil
}

// watchTokens reloads the relay's token file on SIGHUP and when it
// changes (--auth-reload), until ctx is done.
func (s *serveSecurity) watchTokens(ctx context.Context, v *auth.Verifier, g *globals) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	reload := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		v.WatchFile(ctx, s.tokens, s.reload, reload, g.logger)
	}()
	for {
		select {
		case <-ctx.Done():
			<-done
			return nil
		case <-hup:
			select {
			case reload <- struct{}{}:
			case <-ctx.Done():
			}
		}
	}
}

// newCertCmd is `rlhub cert`: a development CA and certificates.
func newCertCmd(g *globals) *cobra.Command {
	var dir, name string
	var hosts []string
	var client, noCN bool
	var valid time.Duration
	cmd := &cobra.Command{
		Use:   "cert --dir DIR",
		Short: "Make a development CA and hub/client certificates (PEM; keys 0600)",
		Long: "cert makes DIR/ca.pem and DIR/ca-key.pem when they are missing (an ECDSA P-256 CA),\n" +
			"then signs certificates with it. With no --name: server.pem for --hosts (usable\n" +
			"as a client certificate too, for hub-to-hub links) and client.pem. With --name N:\n" +
			"one certificate N.pem, a client one with --client. Keys are N-key.pem, mode 0600.\n" +
			"Existing files are never overwritten. Serve with --tls-cert server.pem\n" +
			"--tls-key server-key.pem [--tls-client-ca ca.pem]; clients pass --tls-ca ca.pem\n" +
			"[--tls-cert client.pem --tls-key client-key.pem].",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// Refused before anything is written: flags that would be
			// silently ignored leave the operator with certificates other
			// than the ones asked for.
			if client && name == "" {
				return fmt.Errorf("--client needs --name NAME: without --name, cert makes the default server.pem and client.pem")
			}
			if client && cmd.Flags().Changed("hosts") {
				return fmt.Errorf("--hosts is for a server certificate: a --client certificate names no hosts (drop --client, or --hosts)")
			}
			if noCN && (name == "" || !client) {
				return fmt.Errorf("--no-cn is for a client certificate: give --name NAME --client")
			}
			caCert, caKey := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
			var ca *auth.CA
			if _, err := os.Stat(caCert); err == nil {
				if ca, err = auth.LoadCA(caCert, caKey); err != nil {
					return err
				}
			} else {
				if ca, err = auth.NewCA("rlhub development CA", valid); err != nil {
					return err
				}
				if err := ca.WriteCA(dir); err != nil {
					return err
				}
				fmt.Fprintf(g.stdout, "wrote %s and %s\n", caCert, caKey)
			}
			type want struct {
				name  string
				hosts []string
			}
			var todo []want
			switch {
			case name == "":
				todo = []want{{"server", hosts}, {"client", nil}}
			case client:
				todo = []want{{name, nil}}
			default:
				todo = []want{{name, hosts}}
			}
			for _, w := range todo {
				c, k, err := ca.Issue(w.name, w.hosts, valid)
				if noCN {
					c, k, err = ca.IssueWithoutCN(valid)
				}
				if err != nil {
					return err
				}
				if err := auth.WritePair(dir, w.name, c, k); err != nil {
					return err
				}
				kind := "client certificate"
				if len(w.hosts) > 0 {
					kind = "server certificate for " + strings.Join(w.hosts, ",")
				}
				fmt.Fprintf(g.stdout, "wrote %s (%s) and %s\n", filepath.Join(dir, w.name+".pem"), kind, filepath.Join(dir, w.name+"-key.pem"))
			}
			return nil
		},
	}
	host, _ := os.Hostname()
	defHosts := []string{"127.0.0.1", "::1", "localhost"}
	if host != "" && host != "localhost" {
		defHosts = append(defHosts, host)
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "rlhub-certs", "directory for the CA and certificates (made 0700)")
	f.StringVar(&name, "name", "", "issue one certificate with this name (default: server and client)")
	f.StringSliceVar(&hosts, "hosts", defHosts, "DNS names and IP addresses a server certificate is valid for")
	f.BoolVar(&client, "client", false, "with --name: a client certificate")
	f.BoolVar(&noCN, "no-cn", false, "with --name --client: no CommonName in the subject (etcd 3.4's JSON gateway, which Python clients use, refuses one once etcd's auth is on)")
	f.DurationVar(&valid, "valid-for", 365*24*time.Hour, "validity of what is issued")
	return cmd
}

// newTokenCmd is `rlhub token`: new, ls, revoke.
func newTokenCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Issue, list and revoke tokens of a hub's --auth-tokens file"}
	var role, scope, name, out, appendTo, maxBytes string
	var expires time.Duration
	var maxModels int
	var maxRPS float64
	newCmd := &cobra.Command{
		Use:   "new --role ROLE --scope PREFIX",
		Short: "Print a new token and the line to add to the hub's token file",
		Long: "token new makes a random token for a role (reader, worker, trainer, admin; each\n" +
			"includes the ones before it) limited to models whose names start with one of\n" +
			"--scope's comma-separated prefixes (\"*\": every model). It prints the token\n" +
			"(give it to the client: --token-file) and the token file line, which holds only\n" +
			"its SHA-256 hash. --out writes the token to a 0600 file; --append adds the line\n" +
			"to a token file (created 0600). A serving hub picks the change up by itself\n" +
			"(serve --auth-reload, or SIGHUP).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := auth.ParseRole(role)
			if err != nil {
				return err
			}
			scopes, err := auth.ParseScopes(scope)
			if err != nil {
				return err
			}
			if name == "" {
				name = role
			}
			if strings.ContainsAny(name, " \t\n=") {
				return fmt.Errorf("--name %s: no white space or '='", errs.Quote(name))
			}
			if err := auth.CheckPrincipalName(name); err != nil {
				return fmt.Errorf("--name: %w", err)
			}
			p := auth.Principal{Name: name, Role: r, Scopes: scopes, Quota: auth.Quota{Models: maxModels, Rate: maxRPS}}
			if expires < 0 || maxModels < 0 || maxRPS < 0 {
				return fmt.Errorf("--expires, --max-models and --max-rps must not be negative")
			}
			if expires > 0 {
				p.Expires = time.Now().Add(expires).UTC().Truncate(time.Second)
			}
			if maxBytes != "" {
				if p.Quota.Bytes, err = auth.ParseBytes(maxBytes); err != nil {
					return fmt.Errorf("--max-bytes: %w", err)
				}
			}
			tok, hash, err := auth.NewToken()
			if err != nil {
				return err
			}
			line := auth.Line(hash, p)
			// --out is written before the line is appended, and removed
			// if the append fails: a failed command leaves nothing behind.
			// This order is the safe one if the process dies between the
			// two: what is left is then an --out file whose token is in
			// no token file (it grants nothing, and a rerun names it:
			// "file exists"), not a line in the hub's token file for a
			// token nobody holds, which no one could tell from a live one
			// and which taking out means rewriting the file a hub reads.
			// It is also the order that fails before touching --append
			// when --out is refused (it exists, its directory is missing).
			// (An append whose write went through and whose fsync failed
			// may leave its line: it grants nothing once --out is gone.)
			if out != "" {
				if err := writeNew(out, tok+"\n"); err != nil {
					return err
				}
			}
			if appendTo != "" {
				if err := appendLine(appendTo, line); err != nil {
					if out != "" {
						if rerr := os.Remove(out); rerr != nil {
							err = errors.Join(err, fmt.Errorf("the token written to --out %s is in no token file: %w", out, rerr))
						}
					}
					return err
				}
			}
			if out == "" {
				fmt.Fprintf(g.stdout, "token: %s\n", tok)
			} else {
				fmt.Fprintf(g.stdout, "token written to %s\n", out)
			}
			fmt.Fprintf(g.stdout, "token file line:\n%s\n", line)
			return nil
		},
	}
	f := newCmd.Flags()
	f.StringVar(&role, "role", "", "reader, worker, trainer or admin (required)")
	f.StringVar(&scope, "scope", "", "comma-separated model-name prefixes, \"*\" for every model (required)")
	f.StringVar(&name, "name", "", "name of the token in the hub's logs and errors, and the owner of the models its pushes create (default: the role)")
	f.StringVar(&out, "out", "", "write the token to this new file (0600) instead of printing it")
	f.StringVar(&appendTo, "append", "", "append the line to this token file (created 0600)")
	f.DurationVar(&expires, "expires", 0, "the token is refused this long from now (0: never)")
	f.IntVar(&maxModels, "max-models", 0, "most models the token's pushes may create and own (0: no bound)")
	f.Float64Var(&maxRPS, "max-rps", 0, "most requests per second the token may make, gRPC and data plane together (0: no bound)")
	f.StringVar(&maxBytes, "max-bytes", "", "most bytes the newest versions of the token's models may hold together (bytes, or KiB/MiB/GiB; default no bound)")
	newCmd.MarkFlagRequired("role")
	newCmd.MarkFlagRequired("scope")
	cmd.AddCommand(newCmd)

	var file string
	lsCmd := &cobra.Command{
		Use:   "ls --file FILE",
		Short: "List a token file's tokens: name, role, scopes, expiry, quotas (never a secret)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			tokens, err := auth.ReadFile(file)
			if err != nil {
				return err
			}
			ps := make([]auth.Principal, 0, len(tokens))
			for _, p := range tokens {
				ps = append(ps, p)
			}
			sort.Slice(ps, func(i, j int) bool { return ps[i].Name < ps[j].Name })
			now := time.Now()
			fmt.Fprintf(g.stdout, "%-20s %-8s %-24s %-28s %s\n", "NAME", "ROLE", "SCOPE", "EXPIRES", "QUOTA")
			for _, p := range ps {
				exp := "never"
				if !p.Expires.IsZero() {
					exp = p.Expires.UTC().Format(time.RFC3339)
					if !now.Before(p.Expires) {
						exp += " (expired)"
					}
				}
				q := "-"
				if p.Quota != (auth.Quota{}) {
					q = fmt.Sprintf("models=%d bytes=%d rps=%g", p.Quota.Models, p.Quota.Bytes, p.Quota.Rate)
				}
				sc := make([]string, len(p.Scopes))
				for i, s := range p.Scopes {
					if s == "" {
						s = "*"
					}
					sc[i] = s
				}
				fmt.Fprintf(g.stdout, "%-20s %-8s %-24s %-28s %s\n", p.Name, p.Role, strings.Join(sc, ","), exp, q)
			}
			return nil
		},
	}
	lsCmd.Flags().StringVar(&file, "file", "", "the hub's token file (required)")
	lsCmd.MarkFlagRequired("file")
	cmd.AddCommand(lsCmd)

	var revokeName, revokeFile string
	revokeCmd := &cobra.Command{
		Use:   "revoke --file FILE --name NAME",
		Short: "Remove every token named NAME from a token file (a serving hub cuts its calls on reload)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := revokeTokens(revokeFile, revokeName)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "revoked %d token(s) named %s in %s; a hub serving it refuses them from its next reload (serve --auth-reload, or SIGHUP)\n", n, revokeName, revokeFile)
			return nil
		},
	}
	revokeCmd.Flags().StringVar(&revokeFile, "file", "", "the hub's token file (required)")
	revokeCmd.Flags().StringVar(&revokeName, "name", "", "name of the token(s) to remove (required)")
	revokeCmd.MarkFlagRequired("file")
	revokeCmd.MarkFlagRequired("name")
	cmd.AddCommand(revokeCmd)
	return cmd
}

// revokeTokens rewrites a token file without the lines of tokens named
// name (comments and other lines kept as they are), through a 0600
// temporary file and a rename, so a hub reloading it sees the old file or
// the new one. It fails, changing nothing, when no token has that name or
// the file does not parse.
func revokeTokens(path, name string) (int, error) {
	if _, err := auth.ReadFile(path); err != nil {
		return 0, err
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var keep []string
	n := 0
	for _, line := range strings.SplitAfter(string(raw), "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			ps, err := auth.ParseFile(strings.NewReader(t))
			if err != nil {
				return 0, err
			}
			named := false
			for _, p := range ps { // one line: one principal
				named = p.Name == name
			}
			if named {
				n++
				continue
			}
		}
		keep = append(keep, line)
	}
	if n == 0 {
		return 0, fmt.Errorf("token revoke: no token named %q in %s", name, path)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tokens-*") // mode 0600
	if err != nil {
		return 0, err
	}
	_, err = tmp.WriteString(strings.Join(keep, ""))
	if err = errors.Join(err, tmp.Sync(), tmp.Close()); err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return 0, err
	}
	return n, atomicfile.SyncDir(filepath.Dir(path))
}

// writeNew writes data to a new file of mode 0600; it removes the file
// again when the write fails.
func writeNew(path, data string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// appendLine appends line and a newline to the token file path (created
// 0600), and syncs it.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	// A last line without its newline (written by hand) must not run into
	// this one: the old token would take this line's role, scopes and name.
	sep := ""
	if st, serr := f.Stat(); serr == nil && st.Size() > 0 {
		last := make([]byte, 1)
		if _, rerr := f.ReadAt(last, st.Size()-1); rerr == nil && last[0] != '\n' {
			sep = "\n"
		}
	}
	_, err = fmt.Fprint(f, sep+line+"\n")
	if err == nil {
		err = f.Sync() // the token is handed out: its line must outlive a power cut
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
