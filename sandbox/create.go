package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/go-playground/validator/v10"
)

// Size is a preset name or custom resources; not both.
type Size struct {
	Preset   string `json:"preset,omitempty" validate:"omitempty,oneof=small medium large"`
	VCPUs    int    `json:"vcpus,omitempty" validate:"omitempty,min=1,max=32"`
	MemoryMB int    `json:"memory_mb,omitempty" validate:"omitempty,min=128,max=131072"`
	DiskGB   int    `json:"disk_gb,omitempty" validate:"omitempty,min=1,max=1024"`
}

// MaxTTL is the longest TTL a sandbox can have (30 days).
const MaxTTL = 30 * 24 * time.Hour

// CreateRequest describes a sandbox to create.
type CreateRequest struct {
	Name  string `json:"name,omitempty" validate:"omitempty,max=63,dnslabel"`
	Size  Size   `json:"size"`
	Image string `json:"image,omitempty" validate:"omitempty,max=64,imagename"`
	// TTLSeconds deletes the sandbox that long after creation; 0 means no TTL.
	TTLSeconds int64             `json:"ttl_seconds,omitempty" validate:"gte=0,lte=2592000"`
	Labels     map[string]string `json:"labels,omitempty" validate:"max=32,dive,keys,labelkey,endkeys,max=256"`
	// AccountID places the sandbox in another account than the default;
	// only the operator may name one (a key creates in its own account).
	AccountID string `json:"account_id,omitempty" validate:"max=64"`
	// Project and Fleet are IDs or names; default: the account's default
	// project and no fleet.
	Project string `json:"project,omitempty" validate:"max=64"`
	Fleet   string `json:"fleet,omitempty" validate:"max=64"`
	// Environment pins an environment of the sandbox's project: NAME or
	// ID, with @VERSION (default: its latest version now).
	Environment string `json:"environment,omitempty" validate:"max=80"`
	// ThirdParty makes this a sandbox handed to a third party: it may only
	// get environments marked third_party_safe (a project can make it the
	// default).
	ThirdParty bool `json:"third_party,omitempty"`
	// Firewall is the sandbox's firewall policy (firewall.Policy as JSON),
	// in force before its VM boots; default: the server's default policy.
	Firewall json.RawMessage `json:"firewall,omitempty"`
	// Monitoring false keeps no command history (nor other records of what
	// runs inside) for this sandbox; default true.
	Monitoring *bool `json:"monitoring,omitempty"`
	// Snapshots false refuses every snapshot and fork of this sandbox;
	// default true.
	Snapshots *bool `json:"snapshots,omitempty"`
	// Mesh puts the sandbox on its project's private mesh (true) or not
	// (false); default: what the project says (its mesh).
	Mesh *bool `json:"mesh,omitempty"`
	// Snapshot makes the sandbox from a snapshot (its ID) instead of
	// booting the image: memory, processes and disk as they were. Image
	// and size come from the snapshot (a request that names others is
	// refused); the network policy defaults to the snapshot's source's.
	Snapshot string `json:"snapshot,omitempty" validate:"max=64"`
	// Site and Country ask where the sandbox runs: a site by its name, or
	// any site of a country (ISO 3166-1 alpha-2, upper case); default: the
	// site of the host that takes the create. A create that no host there
	// has room for is refused.
	Site    string `json:"site,omitempty" validate:"omitempty,max=63,dnslabel"`
	Country string `json:"country,omitempty" validate:"omitempty,iso3166_1_alpha2"`
	// Volumes are the project's volumes to attach, mounted in the guest
	// before the create returns: one writer at a time; a reader sees a
	// volume as it was when it attached.
	Volumes []VolumeMount `json:"volumes,omitempty" validate:"max=8,dive"`
	// NoEnv keeps every stored environment out of this sandbox.
	NoEnv bool              `json:"no_env,omitempty"`
	Env   map[string]string `json:"env,omitempty" validate:"max=128,dive,keys,envname,endkeys,max=32768"`
}

// VolumeMount attaches a volume (its name in the sandbox's project) at
// an absolute path in the guest.
type VolumeMount struct {
	Name     string `json:"name" validate:"required,max=63,dnslabel"`
	Path     string `json:"path" validate:"required,max=256,startswith=/"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// DefaultImage is used when a request names none.
const DefaultImage = "default"

var (
	validateOnce sync.Once
	validate     *validator.Validate

	dnsLabelRE  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
	imageRE     = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	labelKeyRE  = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._/-]{0,62}$`)
	envNameRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	fieldMsgFor = map[string]string{
		"oneof":     "must be one of: %s",
		"min":       "must be at least %s",
		"max":       "must be at most %s",
		"gte":       "must be at least %s",
		"lte":       "must be at most %s",
		"dnslabel":  "must be lower-case letters, digits and dashes",
		"imagename": "must be lower-case letters, digits, '.', '_' and '-'",
		"labelkey":  "label keys must be 1-63 of letters, digits, '.', '_', '/' and '-'",
		"envname":   "environment variable names must match [A-Za-z_][A-Za-z0-9_]*",
		"required":  "is required",
	}
)

func validatorInstance() *validator.Validate {
	validateOnce.Do(func() {
		v := validator.New(validator.WithRequiredStructEnabled())
		// Errors name fields as the JSON API does.
		v.RegisterTagNameFunc(func(f reflect.StructField) string {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				return ""
			}
			return name
		})
		for tag, re := range map[string]*regexp.Regexp{
			"dnslabel": dnsLabelRE, "imagename": imageRE, "labelkey": labelKeyRE, "envname": envNameRE,
		} {
			re := re
			v.RegisterValidation(tag, func(fl validator.FieldLevel) bool { return re.MatchString(fl.Field().String()) })
		}
		validate = v
	})
	return validate
}

// Validate checks a struct's validate tags and returns an *Error naming the
// first field at fault (as a JSON path).
func Validate(v any) error {
	err := validatorInstance().Struct(v)
	var verrs validator.ValidationErrors
	if !errors.As(err, &verrs) {
		if err != nil {
			return &Error{Kind: ErrInvalid, Msg: "invalid request", Err: err}
		}
		return nil
	}
	fe := verrs[0]
	field := fe.Namespace()
	if _, rest, ok := strings.Cut(field, "."); ok {
		field = rest // drop the struct's own name
	}
	msg := "is invalid"
	if f, ok := fieldMsgFor[fe.Tag()]; ok {
		msg = f
		if strings.Contains(f, "%s") {
			msg = fmt.Sprintf(f, fe.Param())
		}
	}
	return &Error{Kind: ErrInvalid, Field: field, Msg: msg}
}

// Resolve validates the request and returns its resources and image.
func (r *CreateRequest) Resolve() (Resources, string, error) {
	if err := Validate(r); err != nil {
		return Resources{}, "", err
	}
	s := r.Size
	custom := s.VCPUs != 0 || s.MemoryMB != 0 || s.DiskGB != 0
	var res Resources
	switch {
	case s.Preset != "" && custom:
		return res, "", Errorf(ErrInvalid, "size", "give a preset or custom vcpus/memory_mb/disk_gb, not both")
	case s.Preset != "":
		res = Presets[s.Preset]
	case custom:
		if s.VCPUs == 0 || s.MemoryMB == 0 {
			return res, "", Errorf(ErrInvalid, "size", "a custom size needs vcpus and memory_mb")
		}
		res = Resources{VCPUs: s.VCPUs, MemoryMB: s.MemoryMB, DiskGB: s.DiskGB}
		if res.DiskGB == 0 {
			res.DiskGB = Presets["small"].DiskGB
		}
	default:
		res = Presets["small"]
	}
	img := r.Image
	if img == "" {
		img = DefaultImage
	}
	return res, img, nil
}
