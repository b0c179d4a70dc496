package cli

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Every `rlhub` command line in the README and docs/ (code blocks and
// inline code) names commands and flags the binary has: a flag renamed or
// dropped fails here, not in an operator's shell. The benchmark log
// (docs/benchlog) is history and is not checked.
func TestDocsNameOnlyRealFlags(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md", "../../python/README.md")
	root := newRootCmd(io.Discard, io.Discard)
	lines := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, cl := range commandLines(string(raw)) {
			lines++
			if msg := checkCommandLine(root, cl.text); msg != "" {
				t.Errorf("%s:%d: %s\n\t%s", filepath.Base(f), cl.line, msg, cl.text)
			}
		}
	}
	if lines < 50 {
		t.Fatalf("found %d rlhub command lines in the docs; the scan is broken", lines)
	}
}

type docLine struct {
	line int
	text string
}

var inlineCode = regexp.MustCompile("`([^`]+)`")

// commandLines returns the shell text of every code block line (with its
// backslash continuations joined) and inline code span that runs rlhub.
func commandLines(md string) []docLine {
	var out []docLine
	inBlock := false
	var cont strings.Builder
	contLine := 0
	for i, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			inBlock = !inBlock
			continue
		}
		if inBlock {
			if cont.Len() == 0 {
				contLine = i + 1
			}
			t := strings.TrimSpace(l)
			if strings.HasSuffix(t, "\\") {
				cont.WriteString(strings.TrimSuffix(t, "\\") + " ")
				continue
			}
			cont.WriteString(t)
			out = append(out, docLine{contLine, cont.String()})
			cont.Reset()
			continue
		}
		for _, m := range inlineCode.FindAllStringSubmatch(l, -1) {
			out = append(out, docLine{i + 1, m[1]})
		}
	}
	var runs []docLine
	for _, d := range out {
		if rlhubWord.MatchString(d.text) {
			runs = append(runs, d)
		}
	}
	return runs
}

// rlhubWord is the binary as docs run it: rlhub, bin/rlhub, ./bin/rlhub,
// $RLHUB… (not the Python package, rlhub.something, or rlhub-prefixed
// names).
var rlhubWord = regexp.MustCompile(`(^|[\s(;&|$])(\./)?(bin/)?rlhub\s+[a-z]`)

// checkCommandLine checks each rlhub invocation in text: its subcommands
// exist and each --flag is one the command takes. "" when all is well.
func checkCommandLine(root *cobra.Command, text string) string {
	toks := strings.Fields(text)
	var problems []string
	for i := 0; i < len(toks); i++ {
		w := strings.TrimPrefix(strings.TrimPrefix(toks[i], "./"), "bin/")
		if w != "rlhub" || i+1 >= len(toks) {
			continue
		}
		cmd := root
		j := i + 1
		for ; j < len(toks); j++ {
			t := toks[j]
			if strings.HasPrefix(t, "-") {
				break
			}
			next := child(cmd, t)
			if next == nil {
				break
			}
			cmd = next
		}
		if cmd == root {
			continue // prose such as "rlhub is"
		}
		for ; j < len(toks); j++ {
			t := toks[j]
			if isShellBreak(t) {
				break
			}
			if !strings.HasPrefix(t, "--") || t == "--" {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimPrefix(t, "--"), "=")
			name = strings.TrimRight(name, ",.;:)`'\"")
			if name == "" || strings.ContainsAny(name, "…<>[]{}*$") {
				continue
			}
			if cmd.Flags().Lookup(name) == nil && cmd.InheritedFlags().Lookup(name) == nil && name != "help" {
				problems = append(problems, cmd.CommandPath()+": no flag --"+name)
			}
		}
		i = j
	}
	return strings.Join(problems, "; ")
}

func child(cmd *cobra.Command, name string) *cobra.Command {
	for _, c := range cmd.Commands() {
		if c.Name() == name || c.HasAlias(name) {
			return c
		}
	}
	return nil
}

func isShellBreak(t string) bool {
	switch t {
	case "|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1", "#", "<":
		return true
	}
	return strings.HasPrefix(t, ">") || strings.HasPrefix(t, "2>") || strings.HasSuffix(t, ";") || strings.HasSuffix(t, "&")
}
