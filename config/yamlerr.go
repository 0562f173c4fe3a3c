package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// yaml.v3 reports decode problems by line only ("line 7: field foo not
// found in type config.Upstream"). Operators think in keys, so the errors
// are rewritten with the dotted key found at that line of the document.

var (
	lineRE    = regexp.MustCompile(`^line (\d+): (.*)$`)
	unknownRE = regexp.MustCompile(`^field (\S+) not found in type `)
)

func explainYAMLError(data []byte, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return fmt.Errorf("config: %w", err)
	}
	var root yaml.Node
	keys := map[int]string{}
	if yaml.Unmarshal(data, &root) == nil {
		indexKeys(&root, "", keys)
	}
	msgs := make([]string, 0, len(te.Errors))
	for _, e := range te.Errors {
		m := lineRE.FindStringSubmatch(e)
		if m == nil {
			msgs = append(msgs, e)
			continue
		}
		line, _ := strconv.Atoi(m[1])
		key, reason := keys[line], m[2]
		if u := unknownRE.FindStringSubmatch(reason); u != nil {
			parent := parentPath(key)
			reason = "unknown key"
			if valid := knownKeys(parent); len(valid) > 0 {
				reason += "; valid keys here: " + strings.Join(valid, ", ")
			}
		}
		if key == "" {
			msgs = append(msgs, fmt.Sprintf("line %d: %s", line, reason))
			continue
		}
		msgs = append(msgs, fmt.Sprintf("line %d: %s: %s", line, key, reason))
	}
	return fmt.Errorf("config: %s", strings.Join(msgs, "\n"))
}

// indexKeys records, for every line that holds a key or a scalar value, the
// dotted path of the deepest key there.
func indexKeys(n *yaml.Node, prefix string, out map[int]string) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			indexKeys(c, prefix, out)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			path := k.Value
			if prefix != "" {
				path = prefix + "." + k.Value
			}
			out[k.Line] = path
			if v.Kind == yaml.ScalarNode || v.Kind == yaml.AliasNode {
				out[v.Line] = path
			}
			indexKeys(v, path, out)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			path := fmt.Sprintf("%s[%d]", prefix, i)
			if c.Kind == yaml.ScalarNode {
				out[c.Line] = path
			}
			indexKeys(c, path, out)
		}
	}
}

func parentPath(key string) string {
	if i := strings.LastIndexByte(key, '.'); i >= 0 {
		return key[:i]
	}
	return ""
}

// knownKeys lists the yaml keys of the struct found at a dotted path
// ("policy.namespaces[0]") inside Config.
func knownKeys(path string) []string {
	t := reflect.TypeFor[Config]()
	if path != "" {
		for _, part := range strings.Split(path, ".") {
			if i := strings.IndexByte(part, '['); i >= 0 {
				part = part[:i]
			}
			f, ok := fieldByTag(t, part)
			if !ok {
				return nil
			}
			t = f.Type
			for t.Kind() == reflect.Slice || t.Kind() == reflect.Pointer {
				t = t.Elem()
			}
		}
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var keys []string
	for f := range t.Fields() {
		if tag := yamlName(f); tag != "" {
			keys = append(keys, tag)
		}
	}
	return keys
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	if t.Kind() != reflect.Struct {
		return reflect.StructField{}, false
	}
	for f := range t.Fields() {
		if yamlName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func yamlName(f reflect.StructField) string {
	tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if tag == "-" {
		return ""
	}
	return tag
}
