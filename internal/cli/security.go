package cli

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/dial"
	"github.com/rlhub/rlhub/internal/hub"
)

// serveSecurity are serve's server-side security flags; the certificate
// and key are the shared --tls-cert/--tls-key.
type serveSecurity struct {
	tokens   string
	clientCA string
	insecure bool
}

func (s *serveSecurity) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&s.tokens, "auth-tokens", "", "token `FILE` of hashes, roles and scopes (lines printed by rlhub token new): every call then needs a token")
	f.StringVar(&s.clientCA, "tls-client-ca", "", "with --tls-cert: require client certificates signed by this CA (mutual TLS)")
	f.BoolVar(&s.insecure, "insecure", false, "allow a non-loopback --listen without TLS and tokens: plaintext, and anyone who reaches the port may do anything")
}

// apply fills cfg's TLS and Auth from the flags and refuses an exposed
// listener without both (docs/security.md, secure by default).
func (s *serveSecurity) apply(g *globals, cfg *hub.Config) error {
	files := g.conn.files // already resolved against the environment
	if files.Cert != "" || files.Key != "" {
		tc, err := dial.ServerTLS(files.Cert, files.Key, s.clientCA)
		if err != nil {
			return err
		}
		cfg.TLS = tc
	} else if s.clientCA != "" {
		return fmt.Errorf("--tls-client-ca needs --tls-cert and --tls-key")
	}
	if s.tokens != "" {
		v, err := auth.LoadFile(s.tokens)
		if err != nil {
			return err
		}
		cfg.Auth = v
	}
	if isLoopback(cfg.Listen) || (cfg.TLS != nil && cfg.Auth != nil) {
		return nil
	}
	var missing []string
	if cfg.TLS == nil {
		missing = append(missing, "--tls-cert FILE --tls-key FILE")
	}
	if cfg.Auth == nil {
		missing = append(missing, "--auth-tokens FILE")
	}
	if !s.insecure {
		return &exitError{code: 2, err: fmt.Errorf("serve: --listen %s is not a loopback address and the hub would be open to anyone who reaches it: pass %s (make them with `rlhub cert` and `rlhub token new`; docs/security.md), or --insecure to serve it anyway",
			cfg.Listen, strings.Join(missing, " and "))}
	}
	g.logger.Warn("INSECURE: serving a non-loopback address without "+strings.Join(missing, " and ")+
		": traffic is readable and anyone who reaches the port may read, overwrite or delete any model", "listen", cfg.Listen)
	fmt.Fprintf(g.stderr, "rlhub: WARNING: --insecure: %s is served without %s\n", cfg.Listen, strings.Join(missing, " and "))
	return nil
}

// isLoopback reports whether a listen address only accepts connections
// from this machine: a loopback IP or "localhost". An empty host (every
// interface) is not.
func isLoopback(listen string) bool {
	host := dial.HostOf(listen)
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// newCertCmd is `rlhub cert`: a development CA and certificates.
func newCertCmd(g *globals) *cobra.Command {
	var dir, name string
	var hosts []string
	var client bool
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
	f.DurationVar(&valid, "valid-for", 365*24*time.Hour, "validity of what is issued")
	return cmd
}

// newTokenCmd is `rlhub token new`.
func newTokenCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Issue tokens for a hub's --auth-tokens file"}
	var role, scope, name, out, appendTo string
	newCmd := &cobra.Command{
		Use:   "new --role ROLE --scope PREFIX",
		Short: "Print a new token and the line to add to the hub's token file",
		Long: "token new makes a random token for a role (reader, worker, trainer, admin; each\n" +
			"includes the ones before it) limited to models whose names start with one of\n" +
			"--scope's comma-separated prefixes (\"*\": every model). It prints the token\n" +
			"(give it to the client: --token-file) and the token file line, which holds only\n" +
			"its SHA-256 hash. --out writes the token to a 0600 file; --append adds the line\n" +
			"to a token file (created 0600). The hub reads the file at start.",
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
				return fmt.Errorf("--name %q: no white space or '='", name)
			}
			tok, hash, err := auth.NewToken()
			if err != nil {
				return err
			}
			line := auth.Line(hash, auth.Principal{Name: name, Role: r, Scopes: scopes})
			if out != "" {
				if err := writeNew(out, tok+"\n"); err != nil {
					return err
				}
			}
			if appendTo != "" {
				f, err := os.OpenFile(appendTo, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(f, line)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
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
	f.StringVar(&name, "name", "", "name of the token in the hub's logs and errors (default: the role)")
	f.StringVar(&out, "out", "", "write the token to this new file (0600) instead of printing it")
	f.StringVar(&appendTo, "append", "", "append the line to this token file (created 0600)")
	newCmd.MarkFlagRequired("role")
	newCmd.MarkFlagRequired("scope")
	cmd.AddCommand(newCmd)
	return cmd
}

// writeNew writes data to a new file of mode 0600.
func writeNew(path, data string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
