package apiclient_test

import (
	"context"
	"errors"
	"testing"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/internal/testapi"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
)

// A Go client checks the server's answers with errors.Is and the kinds of
// package model, as the engine's callers do: the server's own answers,
// and each code on the wire.
func TestErrorKinds(t *testing.T) {
	url, key := testapi.Server(t)
	c, err := apiclient.New(url, key)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err = c.Get(ctx, "sbx_01m8ka6npde8xkm1x1xncdtwqe")
	if !errors.Is(err, model.ErrNotFound) || !errors.Is(err, sandbox.ErrNotFound) || errors.Is(err, model.ErrForbidden) {
		t.Errorf("a missing sandbox: %v", err)
	}
	_, err = c.Create(ctx, sandbox.CreateRequest{Name: "bad name!", NoEnv: true})
	if !errors.Is(err, model.ErrInvalid) || errors.Is(err, model.ErrNotFound) {
		t.Errorf("an invalid create: %v", err)
	}
	bad, err := apiclient.New(url, "hb_nosuchkey")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Get(ctx, "sbx_01m8ka6npde8xkm1x1xncdtwqe"); !errors.Is(err, model.ErrUnauthenticated) {
		t.Errorf("a wrong key: %v", err)
	}
	for _, k := range model.Kinds {
		e := &apiclient.Error{Code: k.Code}
		if !errors.Is(e, k.Kind) {
			t.Errorf("code %q is not %v", k.Code, k.Kind)
		}
		if model.Code(k.Kind) != k.Code {
			t.Errorf("%v has code %q, want %q", k.Kind, model.Code(k.Kind), k.Code)
		}
	}
	if internal := (&apiclient.Error{Code: model.CodeInternal}); errors.Is(internal, model.ErrNotFound) || errors.Is(internal, errors.New("x")) {
		t.Error("an internal error matches a kind")
	}
}
