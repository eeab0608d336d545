package deploy_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rules"
)

// TestFilesParse parses every YAML and JSON file under deploy/, every document of
// each; a syntax error anywhere fails.
func TestFilesParse(t *testing.T) {
	n := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		switch strings.ToLower(filepath.Ext(path)) {
		case ".yaml", ".yml":
			n++
			if len(readYAMLDocs(t, path)) == 0 {
				t.Errorf("%s: empty", path)
			}
		case ".json":
			n++
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var v any
			if err := json.Unmarshal(data, &v); err != nil {
				t.Errorf("%s: %v", path, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 20 {
		t.Errorf("only %d YAML and JSON files found under deploy/", n)
	}
}

// TestRulesDirectories loads every rules directory of deploy/ with the real
// validator, each file alone and each directory as sluice serve loads it. (What
// compose and Kubernetes load exactly is checked by their tests.)
func TestRulesDirectories(t *testing.T) {
	for _, dir := range []string{rulesDir, filepath.Join(composeDir, "rules")} {
		files, err := filepath.Glob(filepath.Join(dir, "*.y*ml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no rules files (%v)", dir, err)
		}
		for _, f := range files {
			if _, err := rules.Load(f); err != nil {
				t.Errorf("%s:\n%v", f, err)
			}
		}
		if _, err := rules.Load(dir); err != nil {
			t.Errorf("%s:\n%v", dir, err)
		}
	}
}
