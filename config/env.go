package config

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// EnvPrefix starts the name of every configuration environment variable.
//
// The naming rule: LOCKGATE_, then the key's path in the file with each
// camelCase word upper-cased and every boundary (a dot, or a lower-case
// letter or digit followed by an upper-case one) written "_". So
// upstream.uri is LOCKGATE_UPSTREAM_URI, lockstore.defaultLeaseMS is
// LOCKGATE_LOCKSTORE_DEFAULT_LEASE_MS and limits.maxLockIDs is
// LOCKGATE_LIMITS_MAX_LOCK_IDS. A list (policy.namespaces) takes a YAML
// or JSON value: LOCKGATE_POLICY_NAMESPACES='[{match: shop.orders, mode:
// enforce}]'.
const EnvPrefix = "LOCKGATE_"

// envAliases are older names that stay accepted; the rule's name wins
// when both are set.
var envAliases = map[string]string{
	"adminAuth.tokenFile":       EnvAdminToken,
	"lockstore.ownerSecretFile": EnvOwnerSecret,
}

// EnvVar is one environment variable that overrides a configuration key.
type EnvVar struct {
	Name    string // LOCKGATE_...
	Key     string // the key's path in the file, e.g. lockstore.defaultLeaseMS
	Type    string // string, integer, boolean, duration, list (YAML)
	Default string // the value when neither the file nor the environment sets it
	Alias   string // an older name that is also accepted, or ""
}

// EnvName is the environment variable of a configuration key path.
func EnvName(key string) string {
	var b strings.Builder
	b.WriteString(EnvPrefix)
	prev := rune(0)
	for _, r := range key {
		switch {
		case r == '.':
			b.WriteByte('_')
		case unicode.IsUpper(r) && (unicode.IsLower(prev) || unicode.IsDigit(prev)):
			b.WriteByte('_')
			b.WriteRune(r)
		default:
			b.WriteRune(unicode.ToUpper(r))
		}
		prev = r
	}
	return b.String()
}

// field is one settable key of Config, found by walking its yaml tags.
type field struct {
	key string
	v   reflect.Value
}

var durationType = reflect.TypeFor[Duration]()

func fields(c *Config) []field {
	var out []field
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		t := v.Type()
		for i := range t.NumField() {
			sf := t.Field(i)
			name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
			if name == "" || name == "-" || !sf.IsExported() {
				continue
			}
			key := prefix + name
			fv := v.Field(i)
			if fv.Kind() == reflect.Struct && fv.Type() != durationType {
				walk(key+".", fv)
				continue
			}
			out = append(out, field{key: key, v: fv})
		}
	}
	walk("", reflect.ValueOf(c).Elem())
	return out
}

func typeName(v reflect.Value) string {
	switch {
	case v.Type() == durationType:
		return "duration"
	case v.Kind() == reflect.String:
		return "string"
	case v.Kind() == reflect.Bool:
		return "boolean"
	case v.CanInt():
		return "integer"
	case v.Kind() == reflect.Slice:
		return "list (YAML)"
	}
	return v.Kind().String()
}

func valueText(v reflect.Value) string {
	switch {
	case v.Type() == durationType:
		return v.Interface().(Duration).String()
	case v.Kind() == reflect.Slice:
		if v.Len() == 0 {
			return "[]"
		}
		b, _ := yaml.Marshal(v.Interface())
		return strings.TrimSpace(string(b))
	}
	return fmt.Sprint(v.Interface())
}

// EnvVars lists every configuration environment variable, in the order
// of the keys in Config, with the defaults of Default.
func EnvVars() []EnvVar {
	var out []EnvVar
	for _, f := range fields(Default()) {
		out = append(out, EnvVar{Name: EnvName(f.key), Key: f.key, Type: typeName(f.v), Default: valueText(f.v), Alias: envAliases[f.key]})
	}
	return out
}

// ApplyEnvVars sets every key whose environment variable is set (see
// EnvPrefix), after the older names that ApplyEnv reads. A value that does
// not parse as its key's type is an error naming the variable and the
// key; values are checked further by Validate.
func (c *Config) ApplyEnvVars(getenv func(string) string) error {
	c.ApplyEnv(getenv)
	var errs []error
	for _, f := range fields(c) {
		name := EnvName(f.key)
		val := getenv(name)
		if val == "" {
			continue
		}
		if err := setFromText(f.v, val); err != nil {
			errs = append(errs, fmt.Errorf("%s (%s): %w", name, f.key, err))
		}
	}
	return errors.Join(errs...)
}

// setFromText parses text as YAML into v: a scalar for scalars (a string
// key takes the text as it is, so "#" or "yes" in a password stay text),
// a whole document for lists, with unknown fields refused.
func setFromText(v reflect.Value, text string) error {
	ptr := v.Addr().Interface()
	switch {
	case v.Kind() == reflect.Slice:
		dec := yaml.NewDecoder(bytes.NewReader([]byte(text)))
		dec.KnownFields(true)
		fresh := reflect.New(v.Type())
		if err := dec.Decode(fresh.Interface()); err != nil {
			return fmt.Errorf("want a YAML or JSON list: %w", err)
		}
		v.Set(fresh.Elem())
		return nil
	case v.Kind() == reflect.String:
		v.SetString(text)
		return nil
	}
	n := &yaml.Node{Kind: yaml.ScalarNode, Value: text}
	if err := n.Decode(ptr); err != nil {
		return fmt.Errorf("want %s: %w", typeName(v), err)
	}
	return nil
}
