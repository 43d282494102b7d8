package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
)

// maxConfig bounds a config file: it holds a few dozen settings.
const maxConfig = 1 << 20

// applyConfig sets fs's flags from a YAML file whose keys are the flags'
// names ("data-dir: /var/lib/harebox"), except those given on the command
// line, which win. An unknown key, a value that is not a scalar, a bad
// value and a key given twice are errors that name the key and its line.
func applyConfig(fs *flag.FlagSet, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfig+1))
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	if len(b) > maxConfig {
		return fmt.Errorf("config %s: larger than %d bytes", path, maxConfig)
	}
	var doc, more yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file sets nothing
		}
		return fmt.Errorf("config %s: %w", path, err)
	}
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s line %d: one document only (a second one starts here)", path, more.Line)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return fmt.Errorf("config %s: want a mapping of settings (key: value)", path)
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	seen := map[string]bool{}
	m := doc.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		at := func(format string, args ...any) error {
			return fmt.Errorf("config %s line %d: %q: %s", path, k.Line, k.Value, fmt.Sprintf(format, args...))
		}
		switch {
		case k.Kind != yaml.ScalarNode:
			return fmt.Errorf("config %s line %d: a key must be a flag's name", path, k.Line)
		case k.Value == "config":
			return at("a config file cannot name another")
		case fs.Lookup(k.Value) == nil:
			return at("unknown setting (the settings are hareboxd's flags, without the dashes)")
		case seen[k.Value]:
			return at("given twice")
		case v.Kind != yaml.ScalarNode || v.Tag == "!!null":
			return at("want one value (a string, number, boolean or duration such as 15s)")
		}
		seen[k.Value] = true
		if onCommandLine[k.Value] {
			continue
		}
		if err := fs.Set(k.Value, v.Value); err != nil {
			return at("invalid value %q: %v", v.Value, err)
		}
	}
	return nil
}
