// Package metricset is a prometheus.Collector made of the collectors a
// component creates, so that a component's Metrics struct is one
// registrable collector without a hand-kept list in Describe and Collect
// that a new metric can be left out of.
//
// A component creates each collector through Add, embeds the Set, and is
// then a prometheus.Collector itself; CollectorFields lets its tests check
// that no collector field was created without Add. Nothing here registers
// anything globally.
package metricset

import (
	"reflect"

	"github.com/prometheus/client_golang/prometheus"
)

// Set is a group of collectors that describes and collects as one.
type Set []prometheus.Collector

// Add appends c to s and returns it, for use inside a struct literal.
func Add[C prometheus.Collector](s *Set, c C) C {
	*s = append(*s, c)
	return c
}

// Describe implements prometheus.Collector.
func (s Set) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range s {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (s Set) Collect(ch chan<- prometheus.Metric) {
	for _, c := range s {
		c.Collect(ch)
	}
}

var collectorType = reflect.TypeFor[prometheus.Collector]()

// CollectorFields counts the fields of the struct v (or *v) whose type is
// a prometheus.Collector, the Set itself excepted: a Metrics struct whose
// Set is shorter has a collector that is never exported. A field tagged
// `metricset:"child"` holds a labelled child of a vector in the Set (kept
// to spare the label lookup) and is not counted.
func CollectorFields(v any) int {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	n := 0
	for f := range t.Fields() {
		if f.Type != reflect.TypeFor[Set]() && f.Type.Implements(collectorType) && f.Tag.Get("metricset") != "child" {
			n++
		}
	}
	return n
}
