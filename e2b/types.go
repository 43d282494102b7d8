package e2b

import (
	"encoding/json"
	"time"
)

// The request and response bodies of the endpoints served, as E2B's
// openapi.yml names them (only the fields these endpoints use).

// NewSandbox is a create's body (POST /sandboxes, POST /v2/sandboxes).
type NewSandbox struct {
	TemplateID string `json:"templateID"`
	// Timeout is the TTL in seconds; absent is 15.
	Timeout             *int32            `json:"timeout,omitempty"`
	AutoPause           *bool             `json:"autoPause,omitempty"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory,omitempty"`
	AutoResume          *AutoResumeConfig `json:"autoResume,omitempty"`
	Secure              *bool             `json:"secure,omitempty"`
	AllowInternetAccess *bool             `json:"allow_internet_access,omitempty"`
	Network             *NetworkConfig    `json:"network,omitempty"`
	Metadata            map[string]string `json:"metadata,omitempty"`
	EnvVars             map[string]string `json:"envVars,omitempty"`
	Mcp                 json.RawMessage   `json:"mcp,omitempty"`
	Iam                 json.RawMessage   `json:"iam,omitempty"`
	VolumeMounts        []VolumeMount     `json:"volumeMounts,omitempty"`
}

// AutoResumeConfig is SandboxAutoResumeConfig.
type AutoResumeConfig struct {
	Enabled bool `json:"enabled"`
}

// VolumeMount is SandboxVolumeMount.
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// ConnectSandbox is a connect's body; SandboxTimeoutRequest a set
// timeout's (the same shape).
type ConnectSandbox struct {
	Timeout *int32 `json:"timeout"`
}

// ResumedSandbox is the deprecated resume's body.
type ResumedSandbox struct {
	Timeout   *int32 `json:"timeout,omitempty"`
	AutoPause *bool  `json:"autoPause,omitempty"`
}

// SandboxPauseRequest is a pause's optional body.
type SandboxPauseRequest struct {
	Memory *bool `json:"memory,omitempty"`
}

// Sandbox is what create, connect and resume return.
type Sandbox struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// SandboxDetail is what info returns.
type SandboxDetail struct {
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain"`
	CPUCount        int32             `json:"cpuCount"`
	MemoryMB        int32             `json:"memoryMB"`
	DiskSizeMB      int32             `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	Lifecycle       Lifecycle         `json:"lifecycle"`
	VolumeMounts    []VolumeMount     `json:"volumeMounts,omitempty"`
}

// Lifecycle is SandboxLifecycle: HareBox kills a sandbox at its timeout
// and never resumes one on traffic.
type Lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// ListedSandbox is one sandbox in a list.
type ListedSandbox struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int32             `json:"cpuCount"`
	MemoryMB    int32             `json:"memoryMB"`
	DiskSizeMB  int32             `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
}

// Error is E2B's error body.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// E2B's sandbox states.
const (
	StateRunning = "running"
	StatePaused  = "paused"
)
