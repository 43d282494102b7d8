package sandboxrt

import (
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/harebox/harebox/hypervisor/consolelog"
)

// serialLog is where a sandbox's console goes (the engine names it, so it
// can bound it).
func serialLog(stateDir string) string { return filepath.Join(stateDir, "serial.log") }

// MaxSerialLogBytes bounds a console log: the guest writes to its serial
// port as fast as it likes, for as long as it lives.
const MaxSerialLogBytes = 8 << 20

// serialTail returns the end of a console log, reading only that.
func serialTail(stateDir string, n int) string {
	f, err := os.Open(serialLog(stateDir))
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > int64(n) {
		f.Seek(fi.Size()-int64(n), io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, int64(n)))
	return strings.TrimSpace(string(b))
}

// consoleTail is the last n bytes of the sandbox's console log, for error
// messages.
func consoleTail(b *box, n int) string {
	if b.keys.Console == nil {
		return serialTail(b.rec.StateDir, n)
	}
	out, err := consolelog.Tail(serialLog(b.rec.StateDir), b.keys.Console, n)
	if err != nil {
		return "(console log: " + err.Error() + ")"
	}
	return strings.TrimSpace(string(out))
}

// boundSerialLogs truncates console logs that grew past the bound.
func (e *Runtime) boundSerialLogs() {
	for _, b := range e.boxes.all() {
		d := b.rec.StateDir
		if fi, err := os.Stat(serialLog(d)); err == nil && fi.Size() > MaxSerialLogBytes {
			os.Truncate(serialLog(d), 0)
		}
	}
}
