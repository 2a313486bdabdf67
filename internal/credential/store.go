package credential

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"isopod/internal/errdefs"
)

// Scheme is how a secret is presented upstream.
type Scheme string

const (
	SchemeBearer Scheme = "bearer" // Authorization: Bearer <secret>
	SchemeBasic  Scheme = "basic"  // Authorization: Basic base64(user:secret)
	SchemeHeader Scheme = "header" // <Header>: <secret>
)

// Alias is one declaration of the store, validated.
type Alias struct {
	Name   string // lower case
	Host   string // one exact name, normalised
	Scheme Scheme
	User   string // basic only
	Header string // header only
	Source string // env:NAME or file:/absolute/path
	Allow  []Rule
	MCP    bool
	CAFile string // optional: PEM roots added to the system's for Host

	caPEM []byte // CAFile's content, as Load read it
}

// Rule is one parsed allow entry.
type Rule struct {
	Methods []string // GET HEAD ... ; readonly is GET and HEAD
	Pattern string   // /path/glob: * one segment, trailing ** any suffix
}

// Store is the parsed credentials file.
type Store struct {
	Path    string
	Aliases map[string]Alias
}

// StoreVersion is the one version of the store's format.
const StoreVersion = 1

// storeFile is the store's JSON form.
type storeFile struct {
	Version     *int       `json:"version"`
	Credentials aliasFiles `json:"credentials"`
}

// aliasFiles are the declarations in the order written, a name given
// twice included (a JSON object read into a map would keep only the
// last).
type aliasFiles []namedAlias

type namedAlias struct {
	name string
	aliasFile
}

// UnmarshalJSON reads the credentials object, refusing unknown fields in
// each declaration.
func (m *aliasFiles) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return fmt.Errorf(`"credentials" is not an object of aliases`)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name, _ := tok.(string)
		var af aliasFile
		if err := dec.Decode(&af); err != nil {
			return fmt.Errorf("alias %q: %w", name, err)
		}
		*m = append(*m, namedAlias{name, af})
	}
	return nil
}

// aliasFile is one declaration's JSON form.
type aliasFile struct {
	Host   string   `json:"host"`
	Scheme string   `json:"scheme"`
	User   string   `json:"user"`
	Header string   `json:"header"`
	Source string   `json:"source"`
	Allow  []string `json:"allow"`
	MCP    bool     `json:"mcp"`
	CAFile string   `json:"ca_file"`
}

// aliasName is the syntax of an alias.
var aliasName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Load reads and validates the store at path: a regular file owned by
// this user, no group or other permission bits, at most MaxFileSize bytes,
// version StoreVersion, no field it does not know, every declaration
// valid. Errors are errdefs.ErrFailedPrecondition and name the file (and
// the alias and field) and the fix.
func Load(path string) (*Store, error) {
	b, err := readPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("credential store: %w", err)
	}
	return parseStore(path, b)
}

// parseStore validates the store's content b, read from path.
func parseStore(path string, b []byte) (*Store, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("credential store %s: %s: %w", path, fmt.Sprintf(format, args...), errdefs.ErrFailedPrecondition)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var f storeFile
	if err := dec.Decode(&f); err != nil {
		return nil, bad("%v: fix its JSON (see docs/credentials.md for the format)", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, bad("text after the JSON object: remove it")
	}
	if f.Version == nil || *f.Version != StoreVersion {
		got := "none"
		if f.Version != nil {
			got = fmt.Sprint(*f.Version)
		}
		return nil, bad(`version %s: set "version": %d`, got, StoreVersion)
	}
	st := &Store{Path: path, Aliases: make(map[string]Alias, len(f.Credentials))}
	for _, na := range f.Credentials {
		name, af := na.name, na.aliasFile
		if !aliasName.MatchString(name) {
			return nil, bad("alias %q: an alias is 1 to 64 letters, digits, '-' and '_': rename it", name)
		}
		key := strings.ToLower(name)
		if _, dup := st.Aliases[key]; dup {
			return nil, bad("alias %q is declared twice (aliases are matched ignoring case): remove or rename one", name)
		}
		a, err := af.alias(key)
		if err != nil {
			return nil, bad("alias %q: %v", name, err)
		}
		st.Aliases[key] = a
	}
	return st, nil
}
