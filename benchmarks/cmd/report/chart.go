package main

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // fresh
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, // replay
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // conflict
}

// chart writes a PNG with two panels: idem's overhead over the bare handler
// per framework (and Fiber's built-in middleware's), and the latency of a
// fresh and a replayed request per store through the engine (log scale).
func chart(r *results, path string) error {
	left, err := overheadPlot(r)
	if err != nil {
		return err
	}
	right, err := storePlot(r)
	if err != nil {
		return err
	}
	const w, h = 36 * vg.Centimeter, 12 * vg.Centimeter
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Centimeter, PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	canvases := plot.Align([][]*plot.Plot{{left, right}}, tiles, dc)
	left.Draw(canvases[0][0])
	right.Draw(canvases[0][1])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func overheadPlot(r *results) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "idem overhead over the bare handler (memory store)"
	p.Y.Label.Text = "added time per request (µs)"
	p.Legend.Top = true
	p.Legend.Left = true

	type group struct {
		label string
		bare  string
		paths map[string]string // fresh/replay/conflict -> benchmark
	}
	var groups []group
	for _, fw := range frameworks {
		base := "BenchmarkMiddleware/fw=" + fw + "/path="
		if _, ok := r.ns(base + "bare"); !ok {
			continue
		}
		groups = append(groups, group{label: fw, bare: base + "bare",
			paths: map[string]string{"fresh": base + "fresh", "replay": base + "replay", "conflict": base + "conflict"}})
	}
	for _, pe := range peers {
		bare := "BenchmarkMiddleware/fw=" + pe.fw + "/path=bare"
		_, ok1 := r.ns(pe.builtin + "/path=fresh")
		_, ok2 := r.ns(bare)
		if ok1 && ok2 {
			groups = append(groups, group{label: pe.fw + "\nbuilt-in", bare: bare,
				paths: map[string]string{"fresh": pe.builtin + "/path=fresh", "replay": pe.builtin + "/path=replay"}})
		}
	}
	var names []string
	for _, g := range groups {
		names = append(names, g.label)
	}
	width := vg.Points(11)
	maxv := 0.0
	for i, path := range []string{"fresh", "replay", "conflict"} {
		vals := make(plotter.Values, len(groups))
		for j, g := range groups {
			bare, _ := r.ns(g.bare)
			if v, ok := r.ns(g.paths[path]); ok {
				vals[j] = max(0, (v-bare)/1e3)
				maxv = max(maxv, vals[j])
			}
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, err
		}
		bars.Color = palette[i]
		bars.LineStyle.Width = 0
		bars.Offset = vg.Length(i-1) * width
		p.Add(bars)
		p.Legend.Add(path, bars)
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.6, float64(len(groups))-0.4
	p.Legend.Left = false
	p.Y.Min = 0
	if maxv > 0 {
		p.Y.Max = maxv * 1.3 // room for the legend
	}
	p.Add(plotter.NewGrid())
	return p, nil
}

// logTicks labels a log axis with plain numbers.
type logTicks struct{}

func (logTicks) Ticks(min, max float64) []plot.Tick {
	var ts []plot.Tick
	for v := 0.1; v <= max*10; v *= 10 {
		for _, m := range []float64{1, 2, 5} {
			x := v * m
			if x < min/2 || x > max*2 {
				continue
			}
			label := ""
			if m == 1 {
				label = fmt.Sprintf("%g", x)
			}
			ts = append(ts, plot.Tick{Value: x, Label: label})
		}
	}
	return ts
}

func storePlot(r *results) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "request latency through the engine, per store"
	p.Y.Label.Text = "time per request (µs, log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = logTicks{}
	p.Legend.Top = true
	p.Legend.Left = true

	var stores []string
	for _, st := range []string{"memory", "redis", "mongo"} {
		if _, ok := r.ns("BenchmarkEngine/store=" + st + "/path=fresh"); ok {
			stores = append(stores, st)
		}
	}
	labels := make([]string, len(stores))
	for i, st := range stores {
		labels[i] = st
		if st == "mongo" {
			if _, ok := r.config["mongo-server"]; ok {
				labels[i] = "mongo (FerretDB test server)"
			}
		}
	}
	shapes := []draw.GlyphDrawer{draw.CircleGlyph{}, draw.TriangleGlyph{}, draw.SquareGlyph{}}
	for i, path := range []string{"fresh", "replay", "conflict"} {
		var pts plotter.XYs
		for j, st := range stores {
			if v, ok := r.ns("BenchmarkEngine/store=" + st + "/path=" + path); ok {
				pts = append(pts, plotter.XY{X: float64(j) + float64(i-1)*0.3, Y: v / 1e3})
			}
		}
		if len(pts) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return nil, err
		}
		sc.GlyphStyle.Color = palette[i]
		sc.GlyphStyle.Shape = shapes[i]
		sc.GlyphStyle.Radius = vg.Points(5)
		p.Add(sc)
		p.Legend.Add(path, sc)
		vals := make([]string, len(pts))
		for k, pt := range pts {
			vals[k] = short(pt.Y)
		}
		lb, err := plotter.NewLabels(plotter.XYLabels{XYs: pts, Labels: vals})
		if err != nil {
			return nil, err
		}
		for k := range lb.TextStyle {
			lb.TextStyle[k].Color = palette[i]
			lb.TextStyle[k].Font.Size = vg.Points(8)
		}
		lb.Offset = vg.Point{X: vg.Points(7), Y: vg.Points(-3)}
		p.Add(lb)
	}
	p.NominalX(labels...)
	p.X.Min, p.X.Max = -0.5, float64(len(stores))-0.5
	p.Y.Max *= 2
	p.Y.Min /= 2
	p.Add(plotter.NewGrid())
	return p, nil
}

func short(us float64) string {
	switch {
	case us >= 1000:
		return fmt.Sprintf("%.1f ms", us/1000)
	case us >= 10:
		return fmt.Sprintf("%.0f µs", us)
	}
	return fmt.Sprintf("%.1f µs", us)
}
