package layout

import (
	"regexp"
	"testing"
)

// TestVolumeUUID: a volume's filesystem UUID is a valid UUID (version 8,
// RFC 9562 variant), the same for the same volume and another for
// another, as mkfs.ext4 -U and the guest agent both read it.
func TestVolumeUUID(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	a, b := VolumeUUID("abc123"), VolumeUUID("abc124")
	if !re.MatchString(a) || !re.MatchString(b) {
		t.Errorf("not version 8 UUIDs: %s %s", a, b)
	}
	if a == b || a != VolumeUUID("abc123") {
		t.Errorf("abc123 %s, abc124 %s, abc123 again %s", a, b, VolumeUUID("abc123"))
	}
}
