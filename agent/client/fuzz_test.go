package client

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/harebox/harebox/agent/agentpb"
)

// FuzzGuestStream feeds arbitrary bytes to the host as the guest's side of
// the channel (yamux frames carrying HTTP/2 carrying gRPC). Whatever comes,
// a call must end with an error or a valid answer, promptly, and never panic.
func FuzzGuestStream(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x10PRI * HTTP/2.0\r\n"))
	f.Add([]byte("\x00\x01\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01"))         // ping
	f.Add([]byte("\x00\x00\x00\x01\x00\x00\x00\x01\xff\xff\xff\xff\x00\x00")) // huge data frame
	f.Fuzz(func(t *testing.T, data []byte) {
		host, guest := net.Pipe()
		go func() {
			go io.Copy(io.Discard, guest)
			guest.Write(data)
		}()
		c, err := New(host, Options{CallTimeout: 200 * time.Millisecond})
		if err != nil {
			guest.Close()
			return
		}
		defer guest.Close()
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		c.Health(ctx)
	})
}

// FuzzGuestMessages decodes arbitrary bytes as each reply message the host
// accepts and runs the host's validation on it.
func FuzzGuestMessages(f *testing.F) {
	fi, _ := proto.Marshal(&agentpb.FileInfo{Path: "/a", Name: "a", Type: agentpb.FileType_FILE_TYPE_REGULAR, Mode: 0o644})
	ex, _ := proto.Marshal(&agentpb.ExecExit{ExitCode: 1, DurationMs: 5})
	f.Add(fi)
	f.Add(ex)
	f.Fuzz(func(t *testing.T, data []byte) {
		var p agentpb.FileInfo
		if proto.Unmarshal(data, &p) == nil {
			if got, err := fileInfo(&p); err == nil && (got.Mode > 0o7777 || got.Size < 0 || len(got.Name) > 255) {
				t.Fatalf("invalid file info accepted: %+v", got)
			}
		}
		var e agentpb.ExecExit
		if proto.Unmarshal(data, &e) == nil {
			if st, err := exitStatus(&e); err == nil && (st.ExitCode < -1 || st.ExitCode > 255 || st.Duration < 0) {
				t.Fatalf("invalid exit accepted: %+v", st)
			}
		}
		var h agentpb.ListDirResponse
		proto.Unmarshal(data, &h)
	})
}
