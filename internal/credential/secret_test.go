package credential

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

const testSecret = "s3cr3t-VALUE-never-shown"

// TestSecretUnprintable checks that no way Go prints, logs, encodes or
// wraps a Secret shows its value.
func TestSecretUnprintable(t *testing.T) {
	s, err := newSecret([]byte(testSecret))
	if err != nil {
		t.Fatal(err)
	}
	holder := struct {
		Name   string
		Secret Secret
		Ptr    *Secret
	}{"x", s, &s}
	cred := Credential{Alias: Alias{Name: "gh"}, secret: s}
	var outs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"} {
		outs = append(outs, fmt.Sprintf(verb, s), fmt.Sprintf(verb, holder), fmt.Sprintf(verb, cred), fmt.Sprintf(verb, &cred))
	}
	outs = append(outs, fmt.Sprint(s, holder, cred), fmt.Sprintln(s), s.String(), s.GoString())
	for _, h := range []func(*bytes.Buffer) slog.Handler{
		func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
		func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
	} {
		var b bytes.Buffer
		log := slog.New(h(&b))
		log.Info("msg", "secret", s, "holder", holder, "cred", cred, "ptr", &s)
		log.Info("msg", slog.Any("secret", s), slog.Group("g", "s", s))
		outs = append(outs, b.String())
	}
	if b, err := json.Marshal(holder); err == nil {
		outs = append(outs, string(b))
	}
	if b, err := json.Marshal(cred); err == nil {
		outs = append(outs, string(b))
	}
	wrapped := fmt.Errorf("using %v: %w", s, errors.New("base"))
	outs = append(outs, wrapped.Error(), fmt.Errorf("%+v", holder).Error())
	for _, o := range outs {
		if strings.Contains(o, testSecret) || strings.Contains(o, "s3cr3t") {
			t.Errorf("the secret shows in %q", o)
		}
	}
	if _, err := json.Marshal(holder); err == nil {
		t.Error("a struct holding a Secret was serialised; want an error")
	}
	if !strings.Contains(fmt.Sprint(s), Redacted) {
		t.Errorf("a Secret prints as %q; want %q", fmt.Sprint(s), Redacted)
	}
}

// TestSecretValue checks the values a secret may hold and that sign
// presents it as each scheme says.
func TestSecretValue(t *testing.T) {
	for _, bad := range []string{"", "a\x00b", "tok\n", "tok\r", "t\x7fk", "tök"} {
		if _, err := newSecret([]byte(bad)); err == nil {
			t.Errorf("secret %q accepted; want refused", bad)
		} else if bad != "" && strings.Contains(err.Error(), bad) {
			t.Errorf("error %q holds the value", err)
		}
	}
	s, err := newSecret([]byte("tok en\t1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		scheme     Scheme
		key, value string
	}{
		{SchemeBearer, "Authorization", "Bearer tok en\t1"},
		{SchemeBasic, "Authorization", "Basic dXNlcjp0b2sgZW4JMQ=="},
		{SchemeHeader, "X-Api-Key", "tok en\t1"},
	} {
		h := http.Header{}
		s.sign(h, tt.scheme, "user", "X-Api-Key")
		if got := h.Get(tt.key); got != tt.value || len(h) != 1 {
			t.Errorf("%s: header %v; want %s: %q", tt.scheme, h, tt.key, tt.value)
		}
	}
}
