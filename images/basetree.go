package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// The debootstrapped tree, before anything of an image is added to it,
// is kept once (OutDir/.debootstrap-KEY.tar, the newest only): the
// default and code-interpreter images start from the same one, so the
// second build unpacks it in seconds instead of debootstrapping again
// (a minute or two of a core).

// baseTree fills root with debootstrap's tree for o: unpacked from the
// kept one with the same inputs, or debootstrapped and kept.
func baseTree(ctx context.Context, lg *logger, o *Options, root string) error {
	key, err := baseKey(o)
	if err != nil {
		return err
	}
	kept := filepath.Join(o.OutDir, ".debootstrap-"+key+".tar")
	if _, err := os.Stat(kept); err == nil {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return err
		}
		lg.step("unpacking the debootstrapped tree %s", filepath.Base(kept))
		if err := run(ctx, lg, "tar: ", "tar", "-x", "-p", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-f", kept, "-C", root); err == nil {
			return nil
		}
		// (A damaged file: debootstrap again, and keep the new tree.)
		lg.step("warning: unpacking %s failed; debootstrapping", kept)
		if err := os.RemoveAll(root); err != nil {
			return err
		}
	}
	if err := debootstrap(ctx, lg, o, root); err != nil {
		return err
	}
	tmp := kept + ".tmp-" + randSuffix()
	if err := run(ctx, lg, "tar: ", "tar", "-c", "--one-file-system", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-f", tmp, "-C", root, "."); err != nil {
		os.Remove(tmp)
		lg.step("warning: the debootstrapped tree is not kept: %v", err)
		return nil
	}
	if err := os.Rename(tmp, kept); err != nil {
		os.Remove(tmp)
		return nil
	}
	// The newest only: an older one is of inputs no build has now.
	olds, _ := filepath.Glob(filepath.Join(o.OutDir, ".debootstrap-*.tar"))
	for _, p := range olds {
		if p != kept {
			os.Remove(p)
		}
	}
	return nil
}

// baseKey names debootstrap's inputs: its version, the suite, mirror,
// components and packages, the keyring's and a script's bytes.
func baseKey(o *Options) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%s\x00", BuilderVersion, o.Suite, o.Mirror, strings.Join(o.Components, ","), strings.Join(o.Packages, ","))
	if v, err := os.ReadFile("/usr/share/debootstrap/functions"); err == nil {
		h.Write(v) // (debootstrap's own code: another version, another tree)
	}
	script := o.Script
	if script == "" {
		script = o.Suite // (the suite's own)
	}
	for _, p := range []string{o.Keyring, scriptPath(script)} {
		if p == "" {
			continue
		}
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) && p != o.Keyring {
			fmt.Fprintf(h, "script:%s\x00", p)
			continue
		}
		if err != nil {
			return "", err
		}
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
