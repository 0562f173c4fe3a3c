package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"
)

// jsonValue is a decoded JSON value that keeps the order of object keys,
// because the order of fields in a BSON document is part of the answer.
type jsonValue struct {
	Obj  []jsonField // when IsObj
	Arr  []jsonValue // when IsArr
	Leaf any         // string, json.Number, bool or nil otherwise

	IsObj, IsArr bool
}

type jsonField struct {
	Key   string
	Value jsonValue
}

func parseJSON(data []byte) (jsonValue, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := parseJSONValue(dec)
	if err != nil {
		return v, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return v, fmt.Errorf("trailing data after the JSON document")
	}
	return v, nil
}

func parseJSONValue(dec *json.Decoder) (jsonValue, error) {
	tok, err := dec.Token()
	if err != nil {
		return jsonValue{}, err
	}
	switch tok {
	case json.Delim('{'):
		v := jsonValue{IsObj: true}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return v, err
			}
			x, err := parseJSONValue(dec)
			if err != nil {
				return v, err
			}
			v.Obj = append(v.Obj, jsonField{k.(string), x})
		}
		_, err := dec.Token()
		return v, err
	case json.Delim('['):
		v := jsonValue{IsArr: true, Arr: []jsonValue{}}
		for dec.More() {
			x, err := parseJSONValue(dec)
			if err != nil {
				return v, err
			}
			v.Arr = append(v.Arr, x)
		}
		_, err := dec.Token()
		return v, err
	}
	return jsonValue{Leaf: tok}, nil
}

// get returns the value of key in an object.
func (v jsonValue) get(key string) (jsonValue, bool) {
	for _, f := range v.Obj {
		if f.Key == key {
			return f.Value, true
		}
	}
	return jsonValue{}, false
}

// without returns the object without the given keys.
func (v jsonValue) without(keys ...string) jsonValue {
	out := jsonValue{IsObj: true}
	for _, f := range v.Obj {
		drop := false
		for _, k := range keys {
			drop = drop || f.Key == k
		}
		if !drop {
			out.Obj = append(out.Obj, f)
		}
	}
	return out
}

// set replaces the value of key in an object.
func (v *jsonValue) set(key string, x jsonValue) {
	for i := range v.Obj {
		if v.Obj[i].Key == key {
			v.Obj[i].Value = x
		}
	}
}

// String writes v indented, one scalar per line, so line diffs point at
// the field that differs.
func (v jsonValue) String() string {
	var b strings.Builder
	v.write(&b, "")
	return b.String()
}

func (v jsonValue) write(b *strings.Builder, indent string) {
	switch {
	case v.IsObj:
		if len(v.Obj) == 0 {
			b.WriteString("{}")
			return
		}
		b.WriteString("{\n")
		for i, f := range v.Obj {
			k, _ := json.Marshal(f.Key)
			b.WriteString(indent + "  " + string(k) + ": ")
			f.Value.write(b, indent+"  ")
			if i < len(v.Obj)-1 {
				b.WriteString(",")
			}
			b.WriteString("\n")
		}
		b.WriteString(indent + "}")
	case v.IsArr:
		if len(v.Arr) == 0 {
			b.WriteString("[]")
			return
		}
		b.WriteString("[\n")
		for i, x := range v.Arr {
			b.WriteString(indent + "  ")
			x.write(b, indent+"  ")
			if i < len(v.Arr)-1 {
				b.WriteString(",")
			}
			b.WriteString("\n")
		}
		b.WriteString(indent + "]")
	default:
		s, _ := json.Marshal(v.Leaf)
		b.Write(s)
	}
}

// canonicalJSON re-encodes a JSON document with sorted keys, for comparing
// documents whose field order is not meaningful (Go maps).
func canonicalJSON(t testing.TB, data []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("invalid JSON %s: %v", data, err)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// diffText reports the differing lines of two texts with a little context;
// empty when they are equal.
func diffText(aName, a, bName, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out strings.Builder
	shown := 0
	for i := 0; i < max(len(al), len(bl)) && shown < 40; i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x == y {
			continue
		}
		shown++
		from := max(0, i-3)
		fmt.Fprintf(&out, "line %d:\n", i+1)
		for j := from; j < i && j < len(al); j++ {
			fmt.Fprintf(&out, "    %s\n", al[j])
		}
		fmt.Fprintf(&out, "  %s: %s\n  %s: %s\n", aName, x, bName, y)
		if len(al) != len(bl) {
			// Line numbers no longer align; the first difference is enough.
			break
		}
	}
	return out.String()
}

// sortedLeaves sorts an array of scalars by their text.
func sortedLeaves(v jsonValue) jsonValue {
	out := jsonValue{IsArr: true, Arr: append([]jsonValue(nil), v.Arr...)}
	sort.Slice(out.Arr, func(i, j int) bool {
		return fmt.Sprint(out.Arr[i].Leaf) < fmt.Sprint(out.Arr[j].Leaf)
	})
	return out
}
