package mcpserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"

	"isopod/internal/errdefs"
)

// Tool arguments are checked here, against the tool's input schema, rather
// than by the SDK: its messages are written for Go programmers
// ("0/1 is less than 1.000000", "map[guest:/a host:b]"), and a model
// reading them cannot tell what to change. Every refusal names the argument
// by its path in the call (timeout_s, copy_out[0].host, env.NAME), says
// what is wanted, and shows at most a short head of what was given: an
// 8 MiB argument is never echoed back.
//
// The checker covers the schema keywords the tools use: type, properties,
// required, additionalProperties, items, minimum and maximum. A
// test holds it to the jsonschema package's verdicts on the same inputs.

// maxShown is how many characters of a refused string value a message
// shows.
const maxShown = 40

// refusal is an argument problem, refused before any work starts.
type refusal struct {
	path, msg string
}

func (r *refusal) Error() string {
	if r.path == "" {
		return r.msg
	}
	return r.path + ": " + r.msg
}

func (r *refusal) Unwrap() error { return errdefs.ErrInvalidArgument }

// coercion rewrites a tool's decoded arguments before they are checked
// (see inspectorArgs).
type coercion func(args map[string]any)

// checkArgs decodes a tool call's arguments, drops optional ones given as
// null (null means not given), applies coerce and checks the result
// against sc. It returns the arguments as JSON for the tool's input type,
// or a *refusal. A schema's defaults are what the tool does without the
// argument, said for clients; they are not filled in here, but applied
// once, where the value is used (a run's, by the core as it normalises
// the request).
func checkArgs(sc *jsonschema.Schema, raw json.RawMessage, coerce coercion) (json.RawMessage, error) {
	args := map[string]any{}
	if len(bytes.TrimSpace(raw)) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		var v any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			return nil, &refusal{"arguments", "are not valid JSON"}
		}
		m, ok := v.(map[string]any)
		if !ok {
			return nil, &refusal{"arguments", "must be an object of argument names and values (got " + describe(v) + ")"}
		}
		args = m
	}
	for k, v := range args {
		if v == nil && !slices.Contains(sc.Required, k) {
			delete(args, k) // null: not given
		}
	}
	if coerce != nil {
		coerce(args)
	}
	if err := checkValue("", sc, args); err != nil {
		return nil, err
	}
	return json.Marshal(args)
}

// checkValue checks v, found at path, against sc.
func checkValue(path string, sc *jsonschema.Schema, v any) error {
	if sc == nil {
		return nil
	}
	types := sc.Types
	if sc.Type != "" {
		types = []string{sc.Type}
	}
	if len(types) > 0 && !slices.ContainsFunc(types, func(t string) bool { return hasType(v, t) }) {
		return &refusal{path, "must be " + typeWords(types) + " (got " + describe(v) + ")"}
	}
	switch v := v.(type) {
	case json.Number:
		return checkRange(path, sc, v)
	case []any:
		for i, item := range v {
			if err := checkValue(fmt.Sprintf("%s[%d]", path, i), sc.Items, item); err != nil {
				return err
			}
		}
	case map[string]any:
		return checkObject(path, sc, v)
	}
	return nil
}

// checkObject checks an object's required, known and extra members.
func checkObject(path string, sc *jsonschema.Schema, m map[string]any) error {
	for _, name := range sc.Required {
		if _, ok := m[name]; !ok {
			return &refusal{join(path, name), "required, but not given"}
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if p, ok := sc.Properties[k]; ok {
			if err := checkValue(join(path, k), p, m[k]); err != nil {
				return err
			}
			continue
		}
		extra := sc.AdditionalProperties
		if extra == nil {
			continue
		}
		if isFalse(extra) {
			return &refusal{join(path, k), "unknown; " + knownNames(path, sc)}
		}
		if err := checkValue(join(path, k), extra, m[k]); err != nil {
			return err
		}
	}
	return nil
}

// checkRange checks a number against minimum and maximum.
func checkRange(path string, sc *jsonschema.Schema, n json.Number) error {
	f, err := n.Float64()
	if err != nil {
		return &refusal{path, "must be a number (got " + describe(n) + ")"}
	}
	lo, hi := sc.Minimum, sc.Maximum
	if (lo == nil || f >= *lo) && (hi == nil || f <= *hi) {
		return nil
	}
	var want string
	switch {
	case lo != nil && hi != nil:
		want = "must be between " + num(*lo) + " and " + num(*hi)
	case lo != nil:
		want = "must be at least " + num(*lo)
	default:
		want = "must be at most " + num(*hi)
	}
	return &refusal{path, want + " (got " + describe(n) + ")"}
}

// hasType reports whether v, decoded with UseNumber, is of JSON Schema
// type t.
func hasType(v any, t string) bool {
	switch t {
	case "null":
		return v == nil
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		if _, err := n.Int64(); err == nil {
			return true
		}
		f, err := n.Float64()
		return err == nil && f == float64(int64(f))
	case "array":
		_, ok := v.([]any)
		return ok
	case "object":
		_, ok := v.(map[string]any)
		return ok
	}
	return false
}

// typeWords says a list of schema types as a model reads them.
func typeWords(types []string) string {
	words := make([]string, 0, len(types))
	for _, t := range types {
		switch t {
		case "boolean":
			words = append(words, "true or false")
		case "integer":
			words = append(words, "a whole number")
		case "array", "object":
			words = append(words, "an "+t)
		case "null":
			words = append(words, "null")
		default:
			words = append(words, "a "+t)
		}
	}
	return strings.Join(words, " or ")
}

// describe says what a refused value was, without echoing much of it.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return strconv.FormatBool(v)
	case json.Number:
		s := v.String()
		if len(s) > maxShown {
			return "a " + strconv.Itoa(len(s)) + "-digit number"
		}
		return s
	case string:
		if utf8.RuneCountInString(v) <= maxShown {
			return strconv.Quote(v)
		}
		head := []rune(v)[:maxShown]
		return strconv.Quote(string(head)) + "... (" + strconv.Itoa(len(v)) + " bytes)"
	case []any:
		return "an array of " + strconv.Itoa(len(v))
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("a %T", v)
}

// knownNames lists the members an object schema accepts.
func knownNames(path string, sc *jsonschema.Schema) string {
	names := slices.Clone(sc.PropertyOrder)
	for n := range sc.Properties {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "it takes no arguments"
	}
	what := "the arguments are "
	if path != "" {
		what = "the fields are "
	}
	return what + strings.Join(names, ", ")
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func isFalse(s *jsonschema.Schema) bool {
	b, err := json.Marshal(s)
	return err == nil && string(b) == "false"
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
