package e2b

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestWriteLineASCII: every character outside ASCII is escaped (the SDK
// decodes each chunk it reads on its own), and the line decodes to what
// was written.
func TestWriteLineASCII(t *testing.T) {
	in := map[string]string{"text": "café 😀 \u2028 <b>&\x01"}
	var buf bytes.Buffer
	if err := writeLine(&buf, in); err != nil {
		t.Fatal(err)
	}
	line := buf.Bytes()
	for _, c := range line {
		if c >= 0x80 {
			t.Fatalf("a byte outside ASCII in %s", line)
		}
	}
	if line[len(line)-1] != '\n' || bytes.Count(line, []byte("\n")) != 1 {
		t.Fatalf("not one line: %q", line)
	}
	var out map[string]string
	if err := json.Unmarshal(line, &out); err != nil || out["text"] != in["text"] {
		t.Fatalf("%s decodes to %q, %v", line, out["text"], err)
	}
}
