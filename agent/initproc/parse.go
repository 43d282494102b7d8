package initproc

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/harebox/harebox/agent/guest"
)

// ParseCmdline parses a kernel command line into key=value parameters (a
// bare word maps to ""). Double quotes group spaces, as the kernel allows;
// everything after "--" belongs to init's argv and is ignored. A repeated
// key keeps its last value, as the kernel does.
func ParseCmdline(s string) map[string]string {
	params := make(map[string]string)
	for _, word := range splitCmdline(s) {
		if word == "--" {
			break
		}
		k, v, _ := strings.Cut(word, "=")
		if k != "" {
			params[k] = v
		}
	}
	return params
}

func splitCmdline(s string) []string {
	var (
		words   []string
		cur     strings.Builder
		inQuote bool
		inWord  bool
	)
	for _, r := range s {
		switch {
		case r == '"':
			inQuote = !inQuote
			inWord = true
		case !inQuote && (r == ' ' || r == '\t' || r == '\n'):
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// PowerButton is an input device that reports the ACPI power button.
type PowerButton struct {
	Event        string // "event3"
	Major, Minor uint32
}

// FindPowerButton looks through sysDir/class/input/event*/device/name for
// the ACPI "Power Button" and returns its device numbers.
func FindPowerButton(sysDir string) (PowerButton, error) {
	matches, err := filepath.Glob(filepath.Join(sysDir, "class/input/event*"))
	if err != nil {
		return PowerButton{}, err
	}
	for _, dir := range matches {
		name, err := os.ReadFile(filepath.Join(dir, "device/name"))
		if err != nil || strings.TrimSpace(string(name)) != "Power Button" {
			continue
		}
		dev, err := os.ReadFile(filepath.Join(dir, "dev"))
		if err != nil {
			return PowerButton{}, fmt.Errorf("power button: %w", err)
		}
		maj, min, err := guest.ParseDevNumbers(string(dev))
		if err != nil {
			return PowerButton{}, fmt.Errorf("power button %s: %w", dir, err)
		}
		return PowerButton{Event: filepath.Base(dir), Major: maj, Minor: min}, nil
	}
	return PowerButton{}, fmt.Errorf("no power button under %s: %w", sysDir, os.ErrNotExist)
}
