package e2b

import (
	"errors"
	"net/http"

	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/volume"
)

// E2B's volumes are HareBox volumes of the key's default project, made
// at Options.VolumeGB (E2B's create names no size). Their content API
// (/volumecontent, reached without a sandbox) is not served: a volume is
// read and written from a sandbox that mounts it (volumeMounts). The
// token the SDK wants is for that API, so it is empty.

// Volume and VolumeAndToken are E2B's.
type Volume struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
}

type VolumeAndToken struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token"`
}

func (h *Handler) listVolumes(w http.ResponseWriter, r *http.Request) error {
	l, err := h.o.Engine.Volumes().List(r.Context(), "", "")
	if err != nil {
		return err
	}
	out := make([]Volume, 0, len(l))
	for _, v := range l {
		out = append(out, Volume{VolumeID: v.ID, Name: v.Name})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) createVolume(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Name string `json:"name"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	v, err := h.o.Engine.Volumes().Create(r.Context(), "", volume.CreateRequest{Name: body.Name, SizeGB: h.o.VolumeGB})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, VolumeAndToken{VolumeID: v.ID, Name: v.Name})
	return nil
}

func (h *Handler) getVolume(w http.ResponseWriter, r *http.Request) error {
	v, err := h.o.Engine.Volumes().Get(r.Context(), "", "", r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, VolumeAndToken{VolumeID: v.ID, Name: v.Name})
	return nil
}

func (h *Handler) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	if err := h.o.Engine.Volumes().Delete(r.Context(), "", "", r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// volumeContent answers E2B's volume content API: not served.
func (h *Handler) volumeContent(w http.ResponseWriter, r *http.Request) error {
	return model.Errorf(model.ErrInvalid, "", "%v", errVolumeContent)
}

var errVolumeContent = errors.New("the volume content API is not served by this server: mount the volume in a sandbox (volumeMounts) and use its files")
