package initproc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseCmdline(t *testing.T) {
	got := ParseCmdline(`console=ttyS0 quiet harebox.root=/dev/vda  harebox.init="/sbin/my init" x=1 x=2 -- harebox.root=/dev/evil` + "\n")
	want := map[string]string{
		"console": "ttyS0", "quiet": "", "harebox.root": "/dev/vda",
		"harebox.init": "/sbin/my init", "x": "2",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := ParseCmdline(""); len(got) != 0 {
		t.Fatalf("empty cmdline: %v", got)
	}
}

func TestFindPowerButton(t *testing.T) {
	sys := t.TempDir()
	add := func(ev, name, dev string) {
		d := filepath.Join(sys, "class/input", ev)
		if err := os.MkdirAll(filepath.Join(d, "device"), 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "device/name"), []byte(name+"\n"), 0o644)
		os.WriteFile(filepath.Join(d, "dev"), []byte(dev+"\n"), 0o644)
	}
	if _, err := FindPowerButton(sys); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("empty sysfs: %v", err)
	}
	add("event0", "AT Translated Set 2 keyboard", "13:64")
	add("event1", "Sleep Button", "13:65")
	add("event2", "Power Button", "13:66")
	pb, err := FindPowerButton(sys)
	if err != nil || pb != (PowerButton{Event: "event2", Major: 13, Minor: 66}) {
		t.Fatalf("got %+v, %v", pb, err)
	}
	os.WriteFile(filepath.Join(sys, "class/input/event2/dev"), []byte("junk"), 0o644)
	if _, err := FindPowerButton(sys); err == nil {
		t.Fatal("bad dev file accepted")
	}
}

func encodeEvents(t *testing.T, evs ...inputEvent) []byte {
	var b bytes.Buffer
	for _, ev := range evs {
		if err := binary.Write(&b, binary.NativeEndian, ev); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

func TestWaitPowerPress(t *testing.T) {
	if n := binary.Size(inputEvent{}); n != 16 && n != 24 {
		t.Fatalf("input_event is %d bytes", n)
	}
	sync := inputEvent{Type: 0}
	b := encodeEvents(t,
		inputEvent{Type: evKey, Code: 30, Value: 1},       // another key
		inputEvent{Type: evKey, Code: keyPower, Value: 0}, // a release
		sync,
		inputEvent{Type: evKey, Code: keyPower, Value: 1}, // the press
	)
	r := bytes.NewReader(b)
	if err := WaitPowerPress(r); err != nil {
		t.Fatalf("press not seen: %v", err)
	}
	if r.Len() != 0 {
		t.Fatalf("%d bytes unread after the press", r.Len())
	}
	// No press: the reader's end is reported.
	err := WaitPowerPress(bytes.NewReader(encodeEvents(t, sync, inputEvent{Type: evKey, Code: keyPower, Value: 0})))
	if err != io.EOF {
		t.Fatalf("without a press: %v", err)
	}
}

func TestWaitForDevice(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "vda")
	go func() {
		time.Sleep(150 * time.Millisecond)
		os.WriteFile(dev, nil, 0o600)
	}()
	if err := waitForDevice(dev, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := waitForDevice(dev+"x", 100*time.Millisecond); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing device: %v", err)
	}
}

func TestRemoveSameDev(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"a/b/c", "d"} {
		os.MkdirAll(filepath.Join(dir, p), 0o755)
	}
	os.WriteFile(filepath.Join(dir, "a/b/c/f"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "top"), []byte("x"), 0o644)
	os.Symlink("/etc/passwd", filepath.Join(dir, "a/link")) // removed, not followed
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		t.Fatal(err)
	}
	removeSameDev(dir, st.Dev)
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left: %v", ents)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatal("followed a symlink")
	}
	// A different device number is never touched.
	os.WriteFile(filepath.Join(dir, "keep"), nil, 0o644)
	removeSameDev(dir, st.Dev+1)
	if _, err := os.Stat(filepath.Join(dir, "keep")); err != nil {
		t.Fatal("removed a file on another device")
	}
}

func TestDescribe(t *testing.T) {
	if got := describe(unix.WaitStatus(9)); got != "killed by signal 9" {
		t.Fatalf("describe(SIGKILL) = %q", got)
	}
	if got := describe(unix.WaitStatus(3 << 8)); got != "exited with 3" {
		t.Fatalf("describe = %q", got)
	}
}
