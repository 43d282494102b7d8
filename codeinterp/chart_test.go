package codeinterp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/harebox/harebox/sandbox"
)

func TestCheckChart(t *testing.T) {
	line := `{"type": "line", "title": "t", "x_label": "x", "y_label": "y", "x_ticks": [0, 1.5], "x_scale": "linear",
		"x_tick_labels": ["0", "1.5"], "y_ticks": ["a"], "y_scale": "categorical", "y_tick_labels": ["a"],
		"elements": [{"label": "l", "points": [[0, "a"], [1.5, "b"], ["2026-12-07T00:00:00", 3]]}]}`
	for name, c := range map[string]struct{ in, want string }{
		"line":    {line, `{"type":"line","title":"t","x_label":"x","y_label":"y","x_ticks":[0,1.5],"x_scale":"linear","x_tick_labels":["0","1.5"],"y_ticks":["a"],"y_scale":"categorical","y_tick_labels":["a"],"elements":[{"label":"l","points":[[0,"a"],[1.5,"b"],["2026-12-07T00:00:00",3]]}]}`},
		"bar":     {`{"type": "bar", "title": "", "elements": [{"label": "A", "value": "3", "group": "g"}]}`, `{"type":"bar","title":"","elements":[{"label":"A","value":"3","group":"g"}]}`},
		"pie":     {`{"type": "pie", "title": "p", "elements": [{"label": "A", "angle": 90, "radius": 1}]}`, `{"type":"pie","title":"p","elements":[{"label":"A","angle":90,"radius":1}]}`},
		"box":     {`{"type": "box_and_whisker", "title": "", "elements": [{"label": "1", "min": 1, "first_quartile": 2, "median": 3, "third_quartile": 4, "max": 5}]}`, `{"type":"box_and_whisker","title":"","elements":[{"label":"1","min":1,"first_quartile":2,"median":3,"third_quartile":4,"max":5,"outliers":[]}]}`},
		"super":   {`{"type": "superchart", "title": "s", "elements": [{"type": "unknown", "title": "u", "elements": []}]}`, `{"type":"superchart","title":"s","elements":[{"type":"unknown","title":"u","elements":[]}]}`},
		"unknown": {`{"type": "unknown", "title": "", "elements": []}`, `{"type":"unknown","title":"","elements":[]}`},
	} {
		got, err := checkChart(json.RawMessage(c.in))
		if err != nil || string(got) != c.want {
			t.Errorf("%s: %s %v\nwant %s", name, got, err, c.want)
		}
	}
	many := func(n int, elem string) string {
		return "[" + strings.TrimSuffix(strings.Repeat(elem+",", n), ",") + "]"
	}
	for name, in := range map[string]string{
		"not an object":       `[1]`,
		"an unknown type":     `{"type": "heatmap", "title": "", "elements": []}`,
		"an unknown field":    `{"type": "unknown", "title": "", "elements": [], "script": "x"}`,
		"an unknown scale":    `{"type": "line", "title": "", "x_scale": "weird", "elements": []}`,
		"no elements":         `{"type": "line", "title": ""}`,
		"an unknown's elems":  `{"type": "unknown", "title": "", "elements": [1]}`,
		"a point of three":    `{"type": "line", "title": "", "elements": [{"label": "", "points": [[1, 2, 3]]}]}`,
		"a point not scalar":  `{"type": "scatter", "title": "", "elements": [{"label": "", "points": [[1, {}]]}]}`,
		"a null point":        `{"type": "line", "title": "", "elements": [{"label": "", "points": [[1, null]]}]}`,
		"a pie's angle text":  `{"type": "pie", "title": "", "elements": [{"label": "", "angle": "90", "radius": 1}]}`,
		"a nested superchart": `{"type": "superchart", "title": "", "elements": [{"type": "superchart", "title": "", "elements": []}]}`,
		"a long title":        fmt.Sprintf(`{"type": "unknown", "title": %q, "elements": []}`, strings.Repeat("x", maxChartText+1)),
		"too many points":     `{"type": "line", "title": "", "elements": [{"label": "", "points": ` + many(maxChartPoints+1, "[1,1]") + `}]}`,
		"too many elements":   `{"type": "bar", "title": "", "elements": ` + many(maxChartElements+1, `{"label":"","value":"1","group":""}`) + `}`,
		"two values":          `{"type": "unknown", "title": "", "elements": []} {}`,
	} {
		if got, err := checkChart(json.RawMessage(in)); !errors.Is(err, ErrInterpreter) {
			t.Errorf("%s: %s %v", name, got, err)
		}
	}
}

// TestRunChart: a figure's result keeps its chart beside its PNG; a
// result with a bad chart is the interpreter's lie.
func TestRunChart(t *testing.T) {
	png := pngOf(t, 64, 48)
	chart := `{"type": "bar", "title": "t", "elements": [{"label": "A", "value": "3", "group": ""}]}`
	c, _ := serve(t, 0,
		`{"type": "result", "main": false, "data": {"image/png": "`+png+`", "text/plain": "<Figure>", "`+ChartMIME+`": `+chart+`}, "metadata": {}}`,
		`{"type": "end", "status": "ok"}`)
	x, err := c.Run(context.Background(), sandbox.CodeRequest{Code: "plot"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Results) != 1 || x.Results[0].PNG != png || string(x.Results[0].Chart) != `{"type":"bar","title":"t","elements":[{"label":"A","value":"3","group":""}]}` {
		t.Fatalf("results: %+v", x.Results)
	}
	c, _ = serve(t, 0,
		`{"type": "result", "main": false, "data": {"`+ChartMIME+`": {"type": "bar", "title": "t", "elements": [{"label": 1}]}}, "metadata": {}}`,
		`{"type": "end", "status": "ok"}`)
	if _, err := c.Run(context.Background(), sandbox.CodeRequest{Code: "plot"}, nil, nil); !errors.Is(err, ErrInterpreter) {
		t.Fatalf("a bad chart: %v", err)
	}
}
