package initproc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

const (
	evKey    = 0x01
	keyPower = 116
)

// inputEvent is struct input_event; its size follows the platform's
// struct timeval.
type inputEvent struct {
	Time  unix.Timeval
	Type  uint16
	Code  uint16
	Value int32
}

// WaitPowerPress reads input events from r until KEY_POWER is pressed
// (nil) or r fails.
func WaitPowerPress(r io.Reader) error {
	buf := make([]byte, binary.Size(inputEvent{}))
	for {
		if _, err := io.ReadFull(r, buf); err != nil {
			return err
		}
		var ev inputEvent
		if err := binary.Read(bytes.NewReader(buf), binary.NativeEndian, &ev); err != nil {
			return err
		}
		if ev.Type == evKey && ev.Code == keyPower && ev.Value == 1 {
			return nil
		}
	}
}

// watchPowerButton waits for the ACPI power button (QMP system_powerdown)
// and then calls press. The button driver may register a little after its
// module loaded, so the device is looked for for a while.
func watchPowerButton(sysDir, devDir string, logf func(string, ...any), press func()) {
	var (
		pb  PowerButton
		err error
	)
	for range 20 {
		if pb, err = FindPowerButton(sysDir); err == nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		logf("power button: %v (system_powerdown will not work)", err)
		return
	}
	dev := filepath.Join(devDir, "input", pb.Event)
	if err := ensureCharDev(dev, pb.Major, pb.Minor); err != nil {
		logf("power button: %v", err)
		return
	}
	f, err := os.Open(dev)
	if err != nil {
		logf("power button: %v", err)
		return
	}
	defer f.Close()
	logf("watching power button %s", dev)
	if err := WaitPowerPress(f); err != nil {
		logf("power button: %v", err)
		return
	}
	logf("power button pressed")
	press()
}

// ensureCharDev creates the device node when devtmpfs has not.
func ensureCharDev(path string, major, minor uint32) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", filepath.Dir(path), err)
	}
	err := unix.Mknod(path, unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor)))
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("mknod %s: %w", path, err)
	}
	return nil
}
