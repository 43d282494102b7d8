package images

import (
	"os"
	"os/exec"
	"testing"
)

// TestInterpreterServer runs the code interpreter's server's own suite
// (images/interpreter/server_test.py) with this host's IPython, pandas and
// Matplotlib: make deps installs Debian's, the versions the image has. (In
// a guest, on real VMs: e2e's TestCodeInterpreter.)
func TestInterpreterServer(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import IPython, pytest").Run(); err != nil {
		t.Skip("Debian's python3-ipython and python3-pytest are not installed (make deps installs them)")
	}
	cmd := exec.Command(py, "-m", "pytest", "interpreter", "-q", "-p", "no:cacheprovider")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("server_test.py: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
