package envdpb_test

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/harebox/harebox/e2b/envdpb/filesystem"
	"github.com/harebox/harebox/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/harebox/harebox/e2b/envdpb/process"
	"github.com/harebox/harebox/e2b/envdpb/process/processconnect"
)

// The procedures are the paths the SDK posts to: exactly E2B's.
func TestProcedures(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{processconnect.ProcessListProcedure, "/process.Process/List"},
		{processconnect.ProcessConnectProcedure, "/process.Process/Connect"},
		{processconnect.ProcessStartProcedure, "/process.Process/Start"},
		{processconnect.ProcessUpdateProcedure, "/process.Process/Update"},
		{processconnect.ProcessStreamInputProcedure, "/process.Process/StreamInput"},
		{processconnect.ProcessSendInputProcedure, "/process.Process/SendInput"},
		{processconnect.ProcessSendSignalProcedure, "/process.Process/SendSignal"},
		{processconnect.ProcessCloseStdinProcedure, "/process.Process/CloseStdin"},
		{filesystemconnect.FilesystemStatProcedure, "/filesystem.Filesystem/Stat"},
		{filesystemconnect.FilesystemMakeDirProcedure, "/filesystem.Filesystem/MakeDir"},
		{filesystemconnect.FilesystemMoveProcedure, "/filesystem.Filesystem/Move"},
		{filesystemconnect.FilesystemListDirProcedure, "/filesystem.Filesystem/ListDir"},
		{filesystemconnect.FilesystemRemoveProcedure, "/filesystem.Filesystem/Remove"},
		{filesystemconnect.FilesystemWatchDirProcedure, "/filesystem.Filesystem/WatchDir"},
		{filesystemconnect.FilesystemCreateWatcherProcedure, "/filesystem.Filesystem/CreateWatcher"},
		{filesystemconnect.FilesystemGetWatcherEventsProcedure, "/filesystem.Filesystem/GetWatcherEvents"},
		{filesystemconnect.FilesystemRemoveWatcherProcedure, "/filesystem.Filesystem/RemoveWatcher"},
	} {
		if c.got != c.want {
			t.Errorf("procedure %s, want %s", c.got, c.want)
		}
	}
}

// The services have these methods and no others, streaming as the spec
// says (a client stream for StreamInput, server streams for Start,
// Connect and WatchDir).
func TestServices(t *testing.T) {
	for _, c := range []struct {
		svc     protoreflect.ServiceDescriptor
		name    protoreflect.FullName
		methods []string
		server  []string
		client  []string
	}{
		{process.File_process_process_proto.Services().Get(0), "process.Process",
			[]string{"List", "Connect", "Start", "Update", "StreamInput", "SendInput", "SendSignal", "CloseStdin"},
			[]string{"Connect", "Start"}, []string{"StreamInput"}},
		{filesystem.File_filesystem_filesystem_proto.Services().Get(0), "filesystem.Filesystem",
			[]string{"Stat", "MakeDir", "Move", "ListDir", "Remove", "WatchDir", "CreateWatcher", "GetWatcherEvents", "RemoveWatcher"},
			[]string{"WatchDir"}, nil},
	} {
		if c.svc.FullName() != c.name {
			t.Errorf("service %s, want %s", c.svc.FullName(), c.name)
		}
		var got []string
		for i := 0; i < c.svc.Methods().Len(); i++ {
			m := c.svc.Methods().Get(i)
			got = append(got, string(m.Name()))
			if m.IsStreamingServer() != slices.Contains(c.server, string(m.Name())) {
				t.Errorf("%s/%s: server streaming %v", c.name, m.Name(), m.IsStreamingServer())
			}
			if m.IsStreamingClient() != slices.Contains(c.client, string(m.Name())) {
				t.Errorf("%s/%s: client streaming %v", c.name, m.Name(), m.IsStreamingClient())
			}
		}
		if !slices.Equal(got, c.methods) {
			t.Errorf("%s methods %v, want %v", c.name, got, c.methods)
		}
	}
}

// A few fields the SDK depends on, by number and JSON name (the Connect
// JSON codec uses the lowerCamelCase names).
func TestFields(t *testing.T) {
	for _, c := range []struct {
		msg    protoreflect.MessageDescriptor
		field  string
		number protoreflect.FieldNumber
		json   string
	}{
		{(&process.StartRequest{}).ProtoReflect().Descriptor(), "stdin", 4, "stdin"},
		{(&process.ProcessEvent_EndEvent{}).ProtoReflect().Descriptor(), "exit_code", 1, "exitCode"},
		{(&process.ProcessEvent{}).ProtoReflect().Descriptor(), "keepalive", 4, "keepalive"},
		{(&process.ProcessSelector{}).ProtoReflect().Descriptor(), "tag", 2, "tag"},
		{(&filesystem.EntryInfo{}).ProtoReflect().Descriptor(), "symlink_target", 10, "symlinkTarget"},
		{(&filesystem.EntryInfo{}).ProtoReflect().Descriptor(), "modified_time", 9, "modifiedTime"},
		{(&filesystem.ListDirRequest{}).ProtoReflect().Descriptor(), "depth", 2, "depth"},
		{(&filesystem.WatchDirRequest{}).ProtoReflect().Descriptor(), "include_entry", 3, "includeEntry"},
	} {
		f := c.msg.Fields().ByName(protoreflect.Name(c.field))
		if f == nil {
			t.Errorf("%s has no field %s", c.msg.FullName(), c.field)
			continue
		}
		if f.Number() != c.number || f.JSONName() != c.json {
			t.Errorf("%s.%s: number %d json %q, want %d %q", c.msg.FullName(), c.field, f.Number(), f.JSONName(), c.number, c.json)
		}
	}
	if process.Signal_SIGNAL_SIGKILL != 9 || process.Signal_SIGNAL_SIGTERM != 15 {
		t.Error("signal numbers differ from the spec's")
	}
}
