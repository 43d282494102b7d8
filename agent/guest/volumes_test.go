package guest

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
)

// TestFreezeVolumeRefuses: a freeze is bounded in time and only of a
// volume's mount point, never of the filesystem a plain directory is on
// (the root's); a thaw of what is not frozen changes nothing. (Freezing
// a mounted volume is tested in a real guest: hypervisortest.)
func TestFreezeVolumeRefuses(t *testing.T) {
	s := New(Options{Logf: t.Logf})
	ctx := context.Background()
	dir := t.TempDir()
	for _, c := range []struct {
		req  *agentpb.FreezeVolumeRequest
		want codes.Code
	}{
		{&agentpb.FreezeVolumeRequest{Path: dir, Seconds: 0}, codes.InvalidArgument},
		{&agentpb.FreezeVolumeRequest{Path: dir, Seconds: 31}, codes.InvalidArgument},
		{&agentpb.FreezeVolumeRequest{Path: "/etc", Seconds: 5}, codes.InvalidArgument},
		{&agentpb.FreezeVolumeRequest{Path: "relative", Seconds: 5}, codes.InvalidArgument},
		{&agentpb.FreezeVolumeRequest{Path: dir, Seconds: 5}, codes.NotFound},
	} {
		if _, err := s.FreezeVolume(ctx, c.req); status.Code(err) != c.want {
			t.Errorf("freeze %+v: %v, want %v", c.req, err, c.want)
		}
	}
	if _, err := s.ThawVolume(ctx, &agentpb.PathRequest{Path: dir}); err != nil {
		t.Errorf("thaw of what is not frozen: %v", err)
	}
}
