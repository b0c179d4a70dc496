package repocheck

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryPackageHasDoc fails when a Go package under cmd/ or internal/
// has no package doc comment in any of its non-test files.
func TestEveryPackageHasDoc(t *testing.T) {
	root := filepath.Join("..", "..")
	for _, top := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() || d.Name() == "testdata" {
				return err
			}
			fset := token.NewFileSet()
			pkgs, err := parser.ParseDir(fset, path, func(fi os.FileInfo) bool {
				return !strings.HasSuffix(fi.Name(), "_test.go")
			}, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				return err
			}
			for name, pkg := range pkgs {
				documented := false
				for _, f := range pkg.Files {
					if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
						documented = true
					}
				}
				if !documented {
					t.Errorf("package %s in %s has no package doc comment", name, path)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
