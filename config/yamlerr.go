package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// yaml.v3 reports decode problems by line only ("line 7: field foo not
// found in type config.Upstream"). Operators think in keys, so the errors
// are rewritten with the dotted key found at that line of the document.

var (
	lineRE    = regexp.MustCompile(`^line (\d+): (.*)$`)
	unknownRE = regexp.MustCompile(`^field (\S+) not found in type `)
	// The value is quoted for scalars only: a mapping or a list is
	// reported without it.
	unmarshalRE = regexp.MustCompile("^cannot unmarshal !!(\\w+)(?: `(.*)`)? into (\\S+)$")
)

func explainYAMLError(data []byte, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		// A syntax error: yaml.v3 names the line where the enclosing
		// block began, which is rarely where the mistake is. An
		// indentation that matches no enclosing key is the usual cause,
		// so point at that line when there is one.
		if line, why := badIndentation(data); line > 0 {
			return fmt.Errorf("config: line %d: %s (the YAML parser said: %v)", line, why, err)
		}
		return fmt.Errorf("config: %w", err)
	}
	var root yaml.Node
	keys, blocks, onLine := map[int]string{}, map[int][]block{}, map[int][]string{}
	if yaml.Unmarshal(data, &root) == nil {
		indexKeys(&root, "", keys, blocks, onLine)
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
		if u := unmarshalRE.FindStringSubmatch(reason); u != nil {
			// A mapping or list is reported at its own first line, which
			// in block style holds its first entry: the key at fault is
			// the one whose value starts there.
			for _, b := range blocks[line] {
				if b.kind == u[1] {
					key = b.path // the deepest one last
				}
			}
			reason = wantedType(key, u[3], u[1], u[2])
		}
		if u := unknownRE.FindStringSubmatch(reason); u != nil {
			// A flow mapping puts several keys on one line
			// ({sheme: {type: flag}}): the one at fault is the one
			// named, not the last one indexed there.
			for _, p := range onLine[line] {
				if p == u[1] || strings.HasSuffix(p, "."+u[1]) {
					key = p
					break
				}
			}
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
// dotted path of the key there (the first one, for a flow collection on
// its key's line), in blocks the path of every mapping or list value
// by the line where that value starts, and in onLine every key's path by
// its line, in document order.
func indexKeys(n *yaml.Node, prefix string, out map[int]string, blocks map[int][]block, onLine map[int][]string) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			indexKeys(c, prefix, out, blocks, onLine)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			path := k.Value
			if prefix != "" {
				path = prefix + "." + k.Value
			}
			out[k.Line] = path
			onLine[k.Line] = append(onLine[k.Line], path)
			if v.Kind == yaml.ScalarNode || v.Kind == yaml.AliasNode {
				out[v.Line] = path
			} else {
				kind := "map"
				if v.Kind == yaml.SequenceNode {
					kind = "seq"
				}
				blocks[v.Line] = append(blocks[v.Line], block{path: path, kind: kind})
			}
			indexKeys(v, path, out, blocks, onLine)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			path := fmt.Sprintf("%s[%d]", prefix, i)
			if _, ok := out[c.Line]; !ok && c.Kind == yaml.ScalarNode {
				out[c.Line] = path
			}
			indexKeys(c, path, out, blocks, onLine)
		}
	}
}

// block is a mapping ("map") or list ("seq") value and the path of its key.
type block struct{ path, kind string }

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

// wantedType says in a person's words what a key takes, for a value of
// the wrong type ("cannot unmarshal !!str `30s` into int64").
func wantedType(key, goType, yamlType, value string) string {
	kind := map[string]string{"int": "number", "float": "number", "bool": "boolean", "map": "mapping", "seq": "list", "null": "null"}[yamlType]
	got := fmt.Sprintf("got %q", value)
	switch {
	case yamlType == "map" || yamlType == "seq":
		got = "got a " + kind
	case yamlType != "str":
		got = fmt.Sprintf("got %s (a %s)", value, kind)
	}
	switch {
	case strings.HasSuffix(key, "MS") && strings.HasPrefix(goType, "int"):
		return "want a whole number of milliseconds, e.g. 30000 for 30 s; " + got
	case strings.HasPrefix(goType, "int") || strings.HasPrefix(goType, "uint"):
		return "want a whole number; " + got
	case goType == "bool":
		return "want true or false; " + got
	case goType == "string" || strings.HasPrefix(goType, "config."):
		return "want a string; " + got
	case strings.HasPrefix(goType, "[]"):
		return "want a list; " + got
	}
	return fmt.Sprintf("want a value of type %s; %s", goType, got)
}

// badIndentation finds the first line whose indentation matches no
// enclosing level of the document (or that indents with a tab), the
// mistake behind most YAML syntax errors in hand-edited config files.
func badIndentation(data []byte) (int, string) {
	levels := []int{0}
	opens := true  // the previous line ends a key with no value: a block may follow
	scalarAt := -1 // inside a block scalar (| or >) of a key at this level
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimLeft(line, " \t")
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		lead := line[:len(line)-len(trimmed)]
		if scalarAt >= 0 {
			if len(lead) > scalarAt {
				continue // text of the block scalar
			}
			scalarAt = -1
		}
		if strings.Contains(lead, "\t") {
			return i + 1, "indented with a tab; YAML indents with spaces only"
		}
		n := len(lead)
		item := strings.HasPrefix(trimmed, "- ") || trimmed == "-"
		if item {
			// A list item may sit at its parent key's level or deeper.
			n += 2
		}
		content := strings.TrimSpace(strings.SplitN(trimmed, " #", 2)[0])
		top := levels[len(levels)-1]
		switch {
		case n > top && !opens && !item:
			return i + 1, fmt.Sprintf("indented by %d spaces, deeper than the key above it, which already has a value", len(lead))
		case n > top:
			levels = append(levels, n)
		case n == top:
		default:
			for len(levels) > 1 && levels[len(levels)-1] > n {
				levels = levels[:len(levels)-1]
			}
			if levels[len(levels)-1] != n {
				return i + 1, fmt.Sprintf("indented by %d spaces, which matches none of the keys above it (at %s spaces)", len(lead), joinInts(levels))
			}
		}
		opens = strings.HasSuffix(content, ":")
		for _, b := range []string{"|", ">", "|-", ">-", "|+", ">+"} {
			if strings.HasSuffix(content, ": "+b) {
				scalarAt = n
			}
		}
	}
	return 0, ""
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}
