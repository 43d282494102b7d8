package images

import (
	"context"
	"embed"
	"fmt"
	"os"
	"path/filepath"

	"github.com/harebox/harebox/agent/layout"
)

// interpreterServer is the code interpreter's server (Python, JavaScript
// and bash contexts behind a small HTTP API on the guest's loopback),
// installed in the code-interpreter image as layout.InterpreterPath;
// interpreterKernel is its Python contexts' kernel (IPython's shell), as
// layout.InterpreterKernelPath, with the modules it imports and the
// JavaScript contexts' kernel (on Node) beside it.
var (
	//go:embed interpreter/server.py
	interpreterServer []byte
	//go:embed interpreter/interpreter_kernel.py interpreter/interpreter_charts.py interpreter/interpreter_kernel.js
	interpreterKernel embed.FS
)

// interpreterFiles are the files of interpreterKernel, by name.
func interpreterFiles() map[string][]byte {
	ents, _ := interpreterKernel.ReadDir("interpreter")
	files := map[string][]byte{}
	for _, e := range ents {
		files[e.Name()], _ = interpreterKernel.ReadFile("interpreter/" + e.Name())
	}
	return files
}

// interpreterUnit runs it as the default user. It is of type notify: the
// server says it is ready once its first kernel is warm, so the boot (and
// a golden snapshot's settling, which waits for the boot) ends after that.
var interpreterUnit = `[Unit]
Description=HareBox code interpreter
After=local-fs.target ` + layout.AgentUnit + `

[Service]
Type=notify
NotifyAccess=main
User=` + layout.DefaultUser + `
WorkingDirectory=` + layout.DefaultHome + `
Environment=HOME=` + layout.DefaultHome + ` PYTHONUNBUFFERED=1 MPLBACKEND=module://matplotlib_inline.backend_inline
ExecStart=/usr/bin/python3 ` + layout.InterpreterPath + ` --listen 127.0.0.1:` + fmt.Sprint(layout.InterpreterPort) + `
Restart=always
RestartSec=1
TimeoutStartSec=10min

[Install]
WantedBy=multi-user.target
`

// installInterpreter puts the server and its unit in root, enabled, and
// builds Matplotlib's font cache for the default user (a first plot
// would spend seconds on it).
func installInterpreter(ctx context.Context, lg *logger, root string) error {
	p := func(rel string) string { return filepath.Join(root, rel) }
	if err := os.MkdirAll(filepath.Dir(p(layout.InterpreterPath)), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(p(layout.InterpreterPath), interpreterServer, 0o644); err != nil {
		return err
	}
	for name, b := range interpreterFiles() {
		if err := os.WriteFile(p(filepath.Join(filepath.Dir(layout.InterpreterKernelPath), name)), b, 0o644); err != nil {
			return err
		}
	}
	unit := "etc/systemd/system/" + layout.InterpreterUnit
	if err := os.WriteFile(p(unit), []byte(interpreterUnit), 0o644); err != nil {
		return err
	}
	link := p("etc/systemd/system/multi-user.target.wants/" + layout.InterpreterUnit)
	os.Remove(link)
	if err := os.Symlink("/"+unit, link); err != nil {
		return err
	}
	return run(ctx, lg, "font cache: ", "/usr/sbin/chroot", root, "/usr/sbin/runuser", "-u", layout.DefaultUser, "--",
		"/usr/bin/env", "HOME="+layout.DefaultHome, "MPLBACKEND=Agg", "/usr/bin/python3", "-c", "import matplotlib.pyplot")
}
