package guard

import (
	"reflect"
	"testing"
	"unsafe"
)

// TestVerdictResetClearsEveryField: a verdict goes back to the guard
// for the next write, on any connection (putVerdict), cleared by verdict.reset.
// Every field, recursively through what the verdict holds by value
// (enforce.Verdict, its flight's room with inflight.Flight, the owners,
// the buffers), unexported ones included, is filled with a value that is
// not zero; reset must leave every one zero, or the next write would
// start from the last one's request, locks or decision. A reset that
// clears only some fields (to save instructions) fails here by the name
// of each field it leaves, including one added to the verdict later.
// The one field kept is msg, the verdict's message buffer (ownMsg),
// which holds no request; it must be kept as it was.
func TestVerdictResetClearsEveryField(t *testing.T) {
	var v verdict
	fillNonZero(t, reflect.ValueOf(&v).Elem(), "verdict")
	walkFields(reflect.ValueOf(&v).Elem(), "verdict", func(path string, f reflect.Value) {
		if f.IsZero() {
			t.Errorf("%s was not filled: the test cannot see whether reset clears it", path)
		}
	})
	m := v.msg
	v.reset()
	walkFields(reflect.ValueOf(&v).Elem(), "verdict", func(path string, f reflect.Value) {
		if !f.IsZero() && path != "verdict.msg" {
			t.Errorf("%s is still set after reset", path)
		}
	})
	if v.msg != m {
		t.Error("reset dropped the verdict's message buffer")
	}
	v.msg = nil
	if !reflect.ValueOf(&v).Elem().IsZero() {
		t.Error("the verdict is not zero after reset")
	}
}

// settable is f, a field reached through unexported ones too, made
// settable: the test fills and reads what only its package writes.
func settable(f reflect.Value) reflect.Value {
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
}

// walkFields calls fn for every leaf held by value in v (a struct or an
// array is walked into; anything else, pointers included, is a leaf).
func walkFields(v reflect.Value, path string, fn func(string, reflect.Value)) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).Type.Size() == 0 {
				continue // noCopy markers and the like hold nothing
			}
			walkFields(settable(v.Field(i)), path+"."+v.Type().Field(i).Name, fn)
		}
	case reflect.Array:
		for i := range v.Len() {
			walkFields(v.Index(i), path+"[]", fn)
		}
	default:
		fn(path, v)
	}
}

// fillNonZero sets every leaf of v (walkFields) to a value that is not
// zero: a pointer to a new zero value, a slice or map of one element, a
// string, one, true; an interface to a guard type that implements it.
func fillNonZero(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	walkFields(v, path, func(path string, f reflect.Value) {
		switch f.Kind() {
		case reflect.Pointer:
			f.Set(reflect.New(f.Type().Elem()))
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 1, 1))
		case reflect.Map:
			m := reflect.MakeMap(f.Type())
			m.SetMapIndex(reflect.New(f.Type().Key()).Elem(), reflect.New(f.Type().Elem()).Elem())
			f.Set(m)
		case reflect.String:
			f.SetString("x")
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			f.SetInt(1)
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
			f.SetUint(1)
		case reflect.Float32, reflect.Float64:
			f.SetFloat(1)
		case reflect.Func:
			f.Set(reflect.MakeFunc(f.Type(), func([]reflect.Value) []reflect.Value { return nil }))
		case reflect.Chan:
			f.Set(reflect.MakeChan(f.Type(), 0))
		case reflect.Interface:
			for _, c := range []any{&flightPlan{}, &connState{}, &msgBuf{}, &verdict{}, "x"} {
				if reflect.TypeOf(c).Implements(f.Type()) {
					f.Set(reflect.ValueOf(c))
					break
				}
			}
			if f.IsNil() {
				t.Fatalf("%s: no value at hand implements %s; add one", path, f.Type())
			}
		default:
			t.Fatalf("%s: cannot fill a %s; teach fillNonZero", path, f.Kind())
		}
	})
}
