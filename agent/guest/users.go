package guest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/harebox/harebox/agent/layout"
)

// account is a resolved user: who a process runs as, or who owns a file.
type account struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups, primary included
	Home   string
	Shell  string
}

var (
	errUnknownUser  = errors.New("unknown user")
	errUnknownGroup = errors.New("unknown group")
	errBadOwner     = errors.New("bad owner")
)

// passwdEntry is one line of /etc/passwd.
type passwdEntry struct {
	name        string
	uid, gid    uint32
	home, shell string
}

// groupEntry is one line of /etc/group.
type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// readColonFile calls fn with the fields of each well-formed line of path
// that has at least n fields. A missing file reads as empty: minimal images
// may have no /etc/passwd at all.
func readColonFile(path string, n int, fn func(f []string)) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, ":")
		if len(fields) < n {
			continue
		}
		fn(fields)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}

func parseID(s string) (uint32, bool) {
	v, err := strconv.ParseUint(s, 10, 32)
	return uint32(v), err == nil
}

// findPasswd returns the first entry matching by name (byName) or uid.
func (s *Server) findPasswd(name string, uid uint32, byName bool) (passwdEntry, bool, error) {
	var found passwdEntry
	ok := false
	err := readColonFile(s.etcPath("passwd"), 7, func(f []string) {
		if ok {
			return
		}
		u, uok := parseID(f[2])
		g, gok := parseID(f[3])
		if !uok || !gok {
			return
		}
		if (byName && f[0] == name) || (!byName && u == uid) {
			found = passwdEntry{name: f[0], uid: u, gid: g, home: f[5], shell: f[6]}
			ok = true
		}
	})
	return found, ok, err
}

func (s *Server) readGroups() ([]groupEntry, error) {
	var out []groupEntry
	err := readColonFile(s.etcPath("group"), 4, func(f []string) {
		g, ok := parseID(f[2])
		if !ok {
			return
		}
		var members []string
		if f[3] != "" {
			members = strings.Split(f[3], ",")
		}
		out = append(out, groupEntry{name: f[0], gid: g, members: members})
	})
	return out, err
}

// lookupUser resolves an exec/owner user spec: "" is the default user (root
// when the image lacks it), "root" is root, digits are a uid (known to
// /etc/passwd or not), anything else must be a name in /etc/passwd.
func (s *Server) lookupUser(spec string) (account, error) {
	if spec == "" {
		a, err := s.lookupUser(layout.DefaultUser)
		if errors.Is(err, errUnknownUser) {
			return s.lookupUser("root")
		}
		return a, err
	}
	var (
		pw  passwdEntry
		ok  bool
		err error
	)
	uid, numeric := parseID(spec)
	if numeric {
		pw, ok, err = s.findPasswd("", uid, false)
	} else {
		pw, ok, err = s.findPasswd(spec, 0, true)
	}
	if err != nil {
		return account{}, err
	}
	if !ok {
		switch {
		case spec == "root":
			pw = passwdEntry{name: "root", home: "/root", shell: "/bin/sh"}
		case numeric:
			// A uid the image does not know still runs, like `setpriv`.
			pw = passwdEntry{name: spec, uid: uid, gid: uid, home: "/", shell: "/bin/sh"}
		default:
			return account{}, fmt.Errorf("%w %q", errUnknownUser, spec)
		}
	}
	a := account{Name: pw.name, UID: pw.uid, GID: pw.gid, Home: pw.home, Shell: pw.shell}
	if a.Home == "" {
		a.Home = "/"
	}
	if a.Shell == "" {
		a.Shell = "/bin/sh"
	}
	groups, err := s.readGroups()
	if err != nil {
		return account{}, err
	}
	a.Groups = []uint32{a.GID}
	for _, g := range groups {
		if g.gid == a.GID {
			continue
		}
		for _, m := range g.members {
			if m == a.Name {
				a.Groups = append(a.Groups, g.gid)
				break
			}
		}
	}
	return a, nil
}

// lookupGroup resolves a group name or numeric gid.
func (s *Server) lookupGroup(spec string) (uint32, error) {
	if gid, ok := parseID(spec); ok {
		return gid, nil
	}
	groups, err := s.readGroups()
	if err != nil {
		return 0, err
	}
	for _, g := range groups {
		if g.name == spec {
			return g.gid, nil
		}
	}
	if spec == "root" {
		return 0, nil
	}
	return 0, fmt.Errorf("%w %q", errUnknownGroup, spec)
}

// lookupOwner resolves "user" or "user:group" to ids. A bare user means the
// user and its primary group, so a file written "as user" is fully theirs.
func (s *Server) lookupOwner(spec string) (uid, gid uint32, err error) {
	user, group, hasGroup := strings.Cut(spec, ":")
	if hasGroup && user == "" {
		return 0, 0, fmt.Errorf("%w %q: empty user", errBadOwner, spec)
	}
	a, err := s.lookupUser(user)
	if err != nil {
		return 0, 0, err
	}
	gid = a.GID
	if hasGroup && group != "" {
		if gid, err = s.lookupGroup(group); err != nil {
			return 0, 0, err
		}
	}
	return a.UID, gid, nil
}
