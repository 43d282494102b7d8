package sandbox

// TimeoutRequest sets a sandbox's TTL after create: it expires TTLSeconds
// from now, or never for 0.
type TimeoutRequest struct {
	TTLSeconds *int64 `json:"ttl_seconds" validate:"required,gte=0,lte=2592000"`
}
