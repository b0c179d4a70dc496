package run

import (
	"fmt"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// plotCurve draws the evaluation return against training episodes (left)
// and against wall time (right), with ±1 std bars, into a PNG.
func plotCurve(path string, rows []Row, sum Summary) error {
	var byEp, byWall plotter.XYs
	var errs plotter.YErrors
	for _, r := range rows {
		if !r.P.HasEval {
			continue
		}
		byEp = append(byEp, plotter.XY{X: float64(r.P.PolicyEpisodes), Y: r.P.EvalMean})
		byWall = append(byWall, plotter.XY{X: r.Wall, Y: r.P.EvalMean})
		errs = append(errs, struct{ Low, High float64 }{r.P.EvalStd, r.P.EvalStd})
	}
	title := fmt.Sprintf("ARS on %s (seed %d, %d workers)", sum.Env, sum.Seed, sum.Workers)
	mk := func(xlabel string, pts plotter.XYs) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = xlabel
		p.Y.Label.Text = "evaluation return"
		p.Add(plotter.NewGrid())
		if len(pts) == 0 {
			return p, nil
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		bars, err := plotter.NewYErrorBars(struct {
			plotter.XYer
			plotter.YErrorer
		}{pts, errs})
		if err != nil {
			return nil, err
		}
		p.Add(line, points, bars)
		if sum.Target != nil {
			x0, x1 := pts[0].X, pts[len(pts)-1].X
			if x1 == x0 {
				x1 = x0 + 1
			}
			tl, err := plotter.NewLine(plotter.XYs{{X: x0, Y: *sum.Target}, {X: x1, Y: *sum.Target}})
			if err != nil {
				return nil, err
			}
			tl.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			p.Add(tl)
			p.Legend.Add(fmt.Sprintf("target %g", *sum.Target), tl)
		}
		return p, nil
	}
	left, err := mk("training episodes behind the evaluated policy", byEp)
	if err != nil {
		return err
	}
	right, err := mk("wall time (s)", byWall)
	if err != nil {
		return err
	}
	img := vgimg.New(12*vg.Inch, 4.5*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 2, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{{left, right}}, tiles, dc)
	left.Draw(canvases[0][0])
	right.Draw(canvases[0][1])
	png := vgimg.PngCanvas{Canvas: img}
	return writeFileFrom(path, png.WriteTo)
}
