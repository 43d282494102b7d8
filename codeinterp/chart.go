package codeinterp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
)

// ChartMIME is the MIME type under which the kernel gives what a
// Matplotlib figure draws as data (images/interpreter/interpreter_charts.py).
const ChartMIME = "application/vnd.harebox.chart+json"

// Bounds of a chart, beyond which it is a lie.
const (
	maxChartElements = 256
	maxChartPoints   = 10000
	maxChartTicks    = 256
	maxChartText     = 4 << 10
)

// Chart types and axis scales, as E2B's SDKs name them.
var (
	chartTypes  = []string{"line", "scatter", "bar", "pie", "box_and_whisker", "superchart", "unknown"}
	chartScales = []string{"linear", "datetime", "categorical", "log", "symlog", "logit", "function", "functionlog", "asinh"}
)

// chart is a chart as the kernel gives it; its elements' shape depends on
// its type.
type chart struct {
	Type        string          `json:"type"`
	Title       string          `json:"title"`
	XLabel      *string         `json:"x_label,omitempty"`
	YLabel      *string         `json:"y_label,omitempty"`
	XUnit       *string         `json:"x_unit,omitempty"`
	YUnit       *string         `json:"y_unit,omitempty"`
	XTicks      []scalar        `json:"x_ticks,omitempty"`
	XScale      string          `json:"x_scale,omitempty"`
	XTickLabels []string        `json:"x_tick_labels,omitempty"`
	YTicks      []scalar        `json:"y_ticks,omitempty"`
	YScale      string          `json:"y_scale,omitempty"`
	YTickLabels []string        `json:"y_tick_labels,omitempty"`
	Elements    json.RawMessage `json:"elements"`
}

type pointData struct {
	Label  string     `json:"label"`
	Points [][]scalar `json:"points"` // each [x, y]
}

type barData struct {
	Label string `json:"label"`
	Value string `json:"value"`
	Group string `json:"group"`
}

type pieData struct {
	Label  string  `json:"label"`
	Angle  float64 `json:"angle"`
	Radius float64 `json:"radius"`
}

type boxData struct {
	Label         string    `json:"label"`
	Min           float64   `json:"min"`
	FirstQuartile float64   `json:"first_quartile"`
	Median        float64   `json:"median"`
	ThirdQuartile float64   `json:"third_quartile"`
	Max           float64   `json:"max"`
	Outliers      []float64 `json:"outliers"`
}

// scalar is a number or a string (a category, a date).
type scalar struct{ v any }

func (s *scalar) UnmarshalJSON(b []byte) error {
	if string(bytes.TrimSpace(b)) == "null" { // (which would decode as 0)
		return fmt.Errorf("null is neither a number nor a string")
	}
	var f float64
	if err := json.Unmarshal(b, &f); err == nil {
		s.v = f
		return nil
	}
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return fmt.Errorf("%s is neither a number nor a string", b)
	}
	s.v = str
	return nil
}

func (s scalar) MarshalJSON() ([]byte, error) { return json.Marshal(s.v) }

// checkChart checks a chart from the kernel and returns it re-encoded
// with only what it may hold.
func checkChart(raw json.RawMessage) (json.RawMessage, error) {
	if len(raw) > MaxResultBytes {
		return nil, lie("a chart of %d bytes", len(raw))
	}
	c, err := decodeChart(raw, true)
	if err != nil {
		return nil, lie("a chart that is not one: %v", err)
	}
	return json.Marshal(c)
}

func decodeChart(raw json.RawMessage, top bool) (*chart, error) {
	var c chart
	if err := strict(raw, &c); err != nil {
		return nil, err
	}
	if !slices.Contains(chartTypes, c.Type) || (c.Type == "superchart" && !top) {
		return nil, fmt.Errorf("type %q", c.Type)
	}
	for _, s := range []string{c.XScale, c.YScale} {
		if s != "" && !slices.Contains(chartScales, s) {
			return nil, fmt.Errorf("scale %q", s)
		}
	}
	if len(c.XTicks) > maxChartTicks || len(c.YTicks) > maxChartTicks || len(c.XTickLabels) > maxChartTicks || len(c.YTickLabels) > maxChartTicks {
		return nil, fmt.Errorf("more than %d ticks", maxChartTicks)
	}
	texts := []string{c.Title}
	for _, p := range []*string{c.XLabel, c.YLabel, c.XUnit, c.YUnit} {
		if p != nil {
			texts = append(texts, *p)
		}
	}
	texts = append(append(texts, c.XTickLabels...), c.YTickLabels...)
	for _, t := range slices.Concat(c.XTicks, c.YTicks) {
		if s, ok := t.v.(string); ok {
			texts = append(texts, s)
		}
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(c.Elements, &elems); err != nil || elems == nil {
		return nil, fmt.Errorf("elements: not a list")
	}
	if len(elems) > maxChartElements || (c.Type == "unknown" && len(elems) != 0) {
		return nil, fmt.Errorf("%d elements", len(elems))
	}
	var out any
	switch c.Type {
	case "line", "scatter":
		es, err := each[pointData](elems)
		if err != nil {
			return nil, err
		}
		for i, e := range es {
			if len(e.Points) > maxChartPoints {
				return nil, fmt.Errorf("more than %d points", maxChartPoints)
			}
			if e.Points == nil {
				es[i].Points = [][]scalar{}
			}
			texts = append(texts, e.Label)
			for _, p := range e.Points {
				if len(p) != 2 {
					return nil, fmt.Errorf("a point of %d values", len(p))
				}
				for _, v := range p {
					if s, ok := v.v.(string); ok {
						texts = append(texts, s)
					}
				}
			}
		}
		out = es
	case "bar":
		es, err := each[barData](elems)
		if err != nil {
			return nil, err
		}
		for _, e := range es {
			texts = append(texts, e.Label, e.Value, e.Group)
		}
		out = es
	case "pie":
		es, err := each[pieData](elems)
		if err != nil {
			return nil, err
		}
		for _, e := range es {
			texts = append(texts, e.Label)
		}
		out = es
	case "box_and_whisker":
		es, err := each[boxData](elems)
		if err != nil {
			return nil, err
		}
		for i, e := range es {
			if len(e.Outliers) > maxChartPoints {
				return nil, fmt.Errorf("more than %d outliers", maxChartPoints)
			}
			if e.Outliers == nil {
				es[i].Outliers = []float64{}
			}
			texts = append(texts, e.Label)
		}
		out = es
	case "superchart":
		var es []*chart
		for _, e := range elems {
			sub, err := decodeChart(e, false)
			if err != nil {
				return nil, fmt.Errorf("a chart of the superchart: %w", err)
			}
			es = append(es, sub)
		}
		out = es
	default:
		out = []any{}
	}
	for _, t := range texts {
		if len(t) > maxChartText {
			return nil, fmt.Errorf("a text of %d bytes", len(t))
		}
	}
	if out == nil {
		out = []any{}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	c.Elements = b
	return &c, nil
}

// each decodes each element strictly as a T.
func each[T any](elems []json.RawMessage) ([]T, error) {
	out := make([]T, 0, len(elems))
	for _, e := range elems {
		var v T
		if err := strict(e, &v); err != nil {
			return nil, fmt.Errorf("an element: %w", err)
		}
		out = append(out, v)
	}
	return out, nil
}

// strict decodes raw into v, refusing unknown fields and trailing values.
func strict(raw json.RawMessage, v any) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return fmt.Errorf("more than one value")
	}
	return nil
}
